package etcdlockgocron

import (
	"fmt"

	"github.com/etcdlock/etcdlock"
)

// DefaultPrefix is the lock name prefix of a Locker made without
// WithPrefix: a job named "report" is locked as "gocron/report".
const DefaultPrefix = "gocron/"

// An Option configures NewLocker. An invalid value makes it return an
// error wrapping etcdlock.ErrInvalidOption.
type Option func(*options) error

// options holds the settings of a Locker; the constructor sets the
// defaults, then applies the options.
type options struct {
	prefix    string // WithPrefix's, for a Locker
	prefixSet bool   // WithPrefix was given
	session   []etcdlock.SessionOption
}

// apply applies opts to o.
func (o *options) apply(opts []Option) error {
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("etcdlockgocron: %w: nil Option", etcdlock.ErrInvalidOption)
		}
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// checkName returns an error matching etcdlock.ErrInvalidName for a name
// no lock or election may have, by the library's answers: too long, or
// one whose keys LockOfKey does not take for a lock's (empty, or in the
// range the library keeps for itself).
func checkName(name string) error {
	if _, ok := etcdlock.LockOfKey(name + "/0"); !ok || len(name) > etcdlock.MaxNameLen {
		return fmt.Errorf("etcdlockgocron: %w: %.64q", etcdlock.ErrInvalidName, name)
	}
	return nil
}

// WithPrefix makes a Locker lock the job named job as the lock named
// prefix + job. Give every replica's Locker the same prefix: the lock
// is the job's only across Lockers that name it alike. A name the
// library refuses (etcdlock.ErrInvalidName) makes that job's Lock fail.
// Default: DefaultPrefix.
func WithPrefix(prefix string) Option {
	return func(o *options) error {
		o.prefix, o.prefixSet = prefix, true
		return nil
	}
}

// WithSessionOptions sets the options of the etcdlock Sessions that a
// Locker makes: etcdlock.WithTTL sets how long a replica that died keeps
// its locks, etcdlock.WithHooks its metrics. Do not give
// etcdlock.WithLease (it makes every session but the first fail: a
// Locker makes a new session when one ends, each needs a lease of its
// own); etcdlock.WithContext is overridden (Close ends the sessions). Default: none, so the TTL is
// etcdlock.DefaultTTL.
func WithSessionOptions(opts ...etcdlock.SessionOption) Option {
	return func(o *options) error {
		o.session = append(o.session, opts...)
		return nil
	}
}
