package etcdlock

import (
	"context"
	"errors"
)

// Do, on every primitive: lock, run fn with a ctx that ends when the hold
// does (or, with WithCancelOnRequest, when it is asked to release), and
// unlock.

// do takes a hold in mode, runs fn with a ctx cancelled the moment the
// hold is lost (context.Cause matching ErrLockLost), and releases it:
// Mutex.Do, RWMutex.Do and RDo, Semaphore.Do. If the hold was lost, do's
// error matches ErrLockLost and also carries fn's error. If taking the
// hold fails, fn does not run and do returns that error. The error is one
// line; errors.Is matches each error it carries.
//
// The release rides out errors that pass while ctx lasts, as Unlock does.
// If ctx has ended when fn returns (the caller gave up, perhaps on its way
// out), it is still tried for a moment (cleanupTimeout) with a context of
// its own; if etcd has not confirmed it by then, do returns and the release
// goes on in the background (see Unlock): not an error of do's, as nothing
// is left for its caller to do.
func (q *queue) do(ctx context.Context, mode KeyMode, fn func(ctx context.Context) error) error {
	if err := q.lock(ctx, mode, true); err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	lost := q.Done()
	var asked <-chan struct{} // nil: never
	if q.opts.cancelOnRequest {
		asked = q.ReleaseRequested()
	}
	finished := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-lost:
			if err := q.Err(); err != nil {
				cancel(err)
			}
		case <-asked:
			cancel(errorf("%w: %s", ErrReleaseRequested, q.label()))
		case <-finished:
		}
	}()
	fnErr := fn(fctx)
	close(finished)
	<-watcherDone
	cancel(nil)

	uctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		uctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
	}
	uerr := q.unlock(uctx, nil, "Unlock")
	switch {
	case errors.Is(uerr, errReleasePending):
		uerr = nil
	case uerr != nil && errors.Is(fnErr, uerr):
		// fn returned the loss (its ctx's cause), perhaps wrapped: that
		// says it all.
		return fnErr
	case errors.Is(uerr, ErrLockLost):
		return join(uerr, fnErr)
	}
	return join(fnErr, uerr)
}
