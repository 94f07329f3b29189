package etcdlock

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The accessors of a hold, which the queue implements once for every
// primitive, are defined on each primitive so that each has a doc that
// names its own calls: a Semaphore has no Unlock, an RWMutex has a read
// lock, and their tokens fence different things. Election defines its own
// in election.go.

// Done returns a channel closed when the current hold ends, for any
// reason: Unlock, or loss (the key was deleted, the session's lease
// expired or was revoked, the session ended, or the WithMaxHold limit
// passed). When nothing is held, Done returns the channel of the last
// hold, or a closed channel if there was none.
//
// The first call of a hold starts watching the key, from the revision at
// which the lock was granted, on the one watch stream the session shares
// among its holds and waiters: no goroutine and no read per hold; a plain
// Lock and Unlock opens no watch. When the key goes, the watch asks etcd
// whether its lease still exists, so that Err tells a revoked or expired
// lease ("lease ... was revoked or expired"; the session ends with it)
// from a deleted key. Loss by lease expiry is reported before etcd can
// give the lock to anyone else: the session counts its lease's life from
// when each renewal was sent and ends a margin before it runs out.
func (m *Mutex) Done() <-chan struct{} { return m.queue.Done() }

// Err returns nil while a hold lasts and after Unlock, and an error
// matching ErrLockLost once a hold ended involuntarily (until the next
// Lock). The end of the session and the WithMaxHold limit are always
// reported; a deleted key only once Done has been called for the hold (Do
// calls it, and Unlock reports it too). Once Unlock has begun, Err
// reports only the loss Unlock reports.
func (m *Mutex) Err() error { return m.queue.Err() }

// Header returns the header of the etcd response that showed the lock was
// granted, or nil when it is not held.
func (m *Mutex) Header() *pb.ResponseHeader { return m.queue.Header() }

// IsOwner returns a comparison that holds only while the current hold
// lasts (its key exists with the create revision it was granted with):
// use it in Txn().If to make a write conditional on holding the lock.
// When the lock is not held the comparison never holds.
func (m *Mutex) IsOwner() clientv3.Cmp { return m.queue.IsOwner() }

// Key returns m's key in etcd: name/<lease ID in hex>.
func (m *Mutex) Key() string { return m.queue.Key() }

// Token returns the fencing token of the current hold: the create revision
// of its key. Successive holders' tokens strictly increase, so a resource
// that remembers the highest token it has seen can reject a stale holder.
// Token returns 0 when the lock is not held; after a loss it returns the
// lost hold's token until Unlock.
func (m *Mutex) Token() int64 { return m.queue.Token() }

// Done returns a channel closed when the current hold, the read lock or
// the write lock, ends for any reason: RUnlock or Unlock, or loss (the key
// was deleted, the session's lease expired or was revoked, the session
// ended, or the WithMaxHold limit passed). Downgrade does not end the
// hold. When nothing is held, Done returns the channel of the last hold,
// or a closed channel if there was none.
//
// The first call of a hold starts watching the key, from the revision at
// which the hold was admitted, on the one watch stream the session shares
// among its holds and waiters: no goroutine and no read per hold; a plain
// lock and release opens no watch. When the key goes, the watch asks etcd
// whether its lease still exists, so that Err tells a revoked or expired
// lease ("lease ... was revoked or expired"; the session ends with it)
// from a deleted key. Loss by lease expiry is reported before etcd can
// admit a hold that this one excludes: the session counts its lease's
// life from when each renewal was sent and ends a margin before it runs
// out.
func (m *RWMutex) Done() <-chan struct{} { return m.queue.Done() }

// Err returns nil while a hold lasts and after RUnlock or Unlock, and an
// error matching ErrLockLost once a hold ended involuntarily (until the
// next RLock or Lock). The end of the session and the WithMaxHold limit
// are always reported; a deleted key only once Done has been called for
// the hold (RDo and Do call it, and the release reports it too). Once
// RUnlock or Unlock has begun, Err reports only the loss the release
// reports.
func (m *RWMutex) Err() error { return m.queue.Err() }

// Header returns the header of the etcd response that showed the current
// hold, a read lock or the write lock, was admitted, or nil when nothing
// is held.
func (m *RWMutex) Header() *pb.ResponseHeader { return m.queue.Header() }

// IsOwner returns a comparison that holds only while the current hold
// lasts (its key exists with the create revision it was admitted with):
// use it in Txn().If to make a write conditional on it. When nothing is
// held the comparison never holds. Under the write lock it guards writes.
// Under a read lock other readers hold too: it guards reads (nothing that
// this read lock excludes is under way), and must not be taken as leave to
// write.
func (m *RWMutex) IsOwner() clientv3.Cmp { return m.queue.IsOwner() }

// Key returns m's key in etcd: name/<lease ID in hex>, for the read lock
// and the write lock alike.
func (m *RWMutex) Key() string { return m.queue.Key() }

// Token returns the fencing token of the current hold: the create revision
// of its key. A hold admitted after a hold that excludes it has a larger
// token: a writer's is larger than every earlier hold's, a reader's larger
// than every earlier writer's. Readers that hold together do not exclude
// each other, so fence writes with the write lock's token. Token returns 0
// when nothing is held; after a loss it returns the lost hold's token
// until it is released (RUnlock or Unlock).
func (m *RWMutex) Token() int64 { return m.queue.Token() }

// Done returns a channel closed when the permits held end, for any
// reason: Release, or loss (the key was deleted, the session's lease
// expired or was revoked, the session ended, or the WithMaxHold limit
// passed). When no permits are held, Done returns the channel of the last
// hold, or a closed channel if there was none.
//
// The first call of a hold starts watching the key, from the revision at
// which the permits were admitted, on the one watch stream the session
// shares among its holds and waiters: no goroutine and no read per hold; a
// plain Acquire and Release opens no watch. When the key goes, the watch
// asks etcd whether its lease still exists, so that Err tells a revoked
// or expired lease ("lease ... was revoked or expired"; the session ends
// with it) from a deleted key. Loss by lease expiry is reported before
// etcd can count the permits as free: the session counts its lease's life
// from when each renewal was sent and ends a margin before it runs out.
func (s *Semaphore) Done() <-chan struct{} { return s.queue.Done() }

// Err returns nil while permits are held and after Release, and an error
// matching ErrLockLost once a hold ended involuntarily (until the next
// Acquire). The end of the session and the WithMaxHold limit are always
// reported; a deleted key only once Done has been called for the hold (Do
// calls it, and Release reports it too). Once Release has begun, Err
// reports only the loss Release reports.
func (s *Semaphore) Err() error { return s.queue.Err() }

// Header returns the header of the etcd response that showed the permits
// were admitted, or nil when none are held.
func (s *Semaphore) Header() *pb.ResponseHeader { return s.queue.Header() }

// IsOwner returns a comparison that holds only while the permits are held
// (the key exists with the create revision it was admitted with): use it
// in Txn().If to make a write conditional on holding them. When no
// permits are held the comparison never holds. Other holders may hold
// permits at the same time: it guards against acting after this hold
// ended, not against them.
func (s *Semaphore) IsOwner() clientv3.Cmp { return s.queue.IsOwner() }

// Key returns s's key in etcd: name/<lease ID in hex>.
func (s *Semaphore) Key() string { return s.queue.Key() }

// Token returns the fencing token of the current hold: the create revision
// of its key. A hold admitted after one it had to wait for has a larger
// token; holds admitted together share the capacity and do not exclude
// each other. Token returns 0 when no permits are held; after a loss it
// returns the lost hold's token until Release.
func (s *Semaphore) Token() int64 { return s.queue.Token() }

// ReleaseRequested returns a channel closed when the current hold is asked
// to release (RequestRelease). The request only asks: the lock stays held
// until Unlock, and Do cancels fn only when made WithCancelOnRequest. A
// request reaches only the holds current when it was made, never a later
// hold of this Mutex. The first call of a hold starts watching for the
// request (a goroutine, which ends with the hold's release or the
// session). When nothing is held, it returns the last hold's channel, or
// nil (never closed) if there was none.
func (m *Mutex) ReleaseRequested() <-chan struct{} { return m.queue.ReleaseRequested() }

// ReleaseRequested returns a channel closed when the current hold, a read
// or a write lock, is asked to release (RequestRelease): a request reaches
// every reader holding when it was made. See Mutex.ReleaseRequested.
func (m *RWMutex) ReleaseRequested() <-chan struct{} { return m.queue.ReleaseRequested() }

// ReleaseRequested returns a channel closed when the current hold of
// permits is asked to release (RequestRelease): a request reaches every
// holder of permits when it was made. See Mutex.ReleaseRequested.
func (s *Semaphore) ReleaseRequested() <-chan struct{} { return s.queue.ReleaseRequested() }
