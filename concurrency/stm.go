package concurrency

import (
	"context"

	v3 "go.etcd.io/etcd/client/v3"
	etcd "go.etcd.io/etcd/client/v3/concurrency"
)

// The software transactional memory is etcd's own: it takes no lock.

// STM is an interface for software transactional memory.
type STM = etcd.STM

// Isolation is an isolation level.
type Isolation = etcd.Isolation

const (
	// SerializableSnapshot provides serializable isolation and also checks
	// for write conflicts.
	SerializableSnapshot = etcd.SerializableSnapshot
	// Serializable reads within the same transaction attempt return data
	// from the at the revision of the first read.
	Serializable = etcd.Serializable
	// RepeatableReads reads within the same transaction attempt always
	// return the same data.
	RepeatableReads = etcd.RepeatableReads
	// ReadCommitted reads keys from any committed revision.
	ReadCommitted = etcd.ReadCommitted
)

type stmOptions struct {
	iso      Isolation
	ctx      context.Context
	prefetch []string
}

// STMOption configures an STM.
type STMOption func(*stmOptions)

// WithIsolation specifies the transaction isolation level.
func WithIsolation(lvl Isolation) STMOption {
	return func(so *stmOptions) { so.iso = lvl }
}

// WithAbortContext specifies the context for permanently aborting the transaction.
func WithAbortContext(ctx context.Context) STMOption {
	return func(so *stmOptions) { so.ctx = ctx }
}

// WithPrefetch is a hint to prefetch a list of keys before trying to apply.
// If an STM transaction will unconditionally fetch a set of keys, prefetching
// those keys will save the round-trip cost from requesting each key one by one
// with Get().
func WithPrefetch(keys ...string) STMOption {
	return func(so *stmOptions) { so.prefetch = append(so.prefetch, keys...) }
}

// NewSTM initiates a new STM instance, using serializable snapshot isolation by default.
func NewSTM(c *v3.Client, apply func(STM) error, so ...STMOption) (*v3.TxnResponse, error) {
	opts := &stmOptions{ctx: c.Ctx()}
	for _, f := range so {
		f(opts)
	}
	// etcd's option type is unexported before v3.6: its options are
	// passed straight on, whatever the client's version.
	return etcd.NewSTM(c, apply, etcd.WithIsolation(opts.iso), etcd.WithAbortContext(opts.ctx), etcd.WithPrefetch(opts.prefetch...))
}

// NewSTMRepeatable is deprecated.
func NewSTMRepeatable(ctx context.Context, c *v3.Client, apply func(STM) error) (*v3.TxnResponse, error) {
	return NewSTM(c, apply, WithAbortContext(ctx), WithIsolation(RepeatableReads))
}

// NewSTMSerializable is deprecated.
func NewSTMSerializable(ctx context.Context, c *v3.Client, apply func(STM) error) (*v3.TxnResponse, error) {
	return NewSTM(c, apply, WithAbortContext(ctx), WithIsolation(Serializable))
}

// NewSTMReadCommitted is deprecated.
func NewSTMReadCommitted(ctx context.Context, c *v3.Client, apply func(STM) error) (*v3.TxnResponse, error) {
	return NewSTM(c, apply, WithAbortContext(ctx), WithIsolation(ReadCommitted))
}
