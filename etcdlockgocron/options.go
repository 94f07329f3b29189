package etcdlockgocron

import (
	"fmt"
	"time"

	"github.com/etcdlock/etcdlock"
)

// DefaultPrefix is the lock name prefix of a Locker made without
// WithPrefix: a job named "report" is locked as "gocron/report".
const DefaultPrefix = "gocron/"

// DefaultTakeoverDelay is how long a replica that wins an Elector's
// election waits before it runs ticks, without WithTakeoverDelay.
const DefaultTakeoverDelay = time.Second

// An Option configures NewLocker or NewElector. An invalid value, or an
// option of the other constructor, makes it return an error wrapping
// etcdlock.ErrInvalidOption.
type Option func(*options) error

// options holds the settings of a Locker or an Elector; the constructor
// sets the defaults, then applies the options.
type options struct {
	prefix    string // WithPrefix's, for a Locker
	prefixSet bool   // WithPrefix was given
	session   []etcdlock.SessionOption
	yield     bool          // YieldOnRequest, for an Elector
	delay     time.Duration // WithTakeoverDelay's, for an Elector
	delaySet  bool          // WithTakeoverDelay was given
	// identity is WithIdentity's, set by the constructor to
	// defaultIdentity when none was given.
	identity    string
	identitySet bool
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
// no lock or election may have (etcdlock.CheckName).
func checkName(name string) error {
	if err := etcdlock.CheckName(name); err != nil {
		return fmt.Errorf("etcdlockgocron: %w", err)
	}
	return nil
}

// WithPrefix makes a Locker lock the job named job as the lock named
// prefix + job. Give every replica's Locker the same prefix: the lock
// is the job's only across Lockers that name it alike. A name the
// library refuses (etcdlock.ErrInvalidName) makes that job's Lock fail.
// An option of NewLocker only. Default: DefaultPrefix.
func WithPrefix(prefix string) Option {
	return func(o *options) error {
		o.prefix, o.prefixSet = prefix, true
		return nil
	}
}

// WithSessionOptions sets the options of the etcdlock Sessions that a
// Locker or an Elector makes: etcdlock.WithTTL sets how long a replica
// that died keeps its locks or its leadership, etcdlock.WithHooks its
// metrics. Do not give etcdlock.WithLease (it makes every session but
// the first fail: a Locker or an Elector makes a new session when one
// ends, each needs a lease of its own); etcdlock.WithContext is
// overridden (Close ends the sessions). Default: none, so the TTL is
// etcdlock.DefaultTTL.
func WithSessionOptions(opts ...etcdlock.SessionOption) Option {
	return func(o *options) error {
		o.session = append(o.session, opts...)
		return nil
	}
}

// YieldOnRequest makes an Elector step down when its leadership is asked
// to (etcdlock.RequestRelease on the election's name, or `etcdlock
// release NAME`): it resigns, so that the next replica in line leads at
// once, and campaigns again at the back of the line, as
// etcdlock.YieldOnRequest makes Lead do. A deploy then moves the
// leadership once, before it stops the leader. An option of NewElector
// only. Default: requests are ignored.
func YieldOnRequest() Option {
	return func(o *options) error {
		o.yield = true
		return nil
	}
}

// WithTakeoverDelay makes a replica that wins an Elector's election wait
// d before it runs ticks (before IsLeader answers nil). Choose d at least
// the worst skew between the replicas' clocks: a previous leader whose
// clock is ahead ran the ticks due up to its last moment as leader by
// its clock, and a successor whose clock is up to d behind fires the
// same ticks up to d later by true time; waiting d, it runs none of them
// again. The ticks that fall in the wait run nowhere, as those of the gap
// between two leaders. Zero runs ticks at once, for replicas whose
// clocks agree. An option of NewElector only; negative values are an
// error. Default: DefaultTakeoverDelay.
func WithTakeoverDelay(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("etcdlockgocron: %w: takeover delay %v", etcdlock.ErrInvalidOption, d)
		}
		o.delay, o.delaySet = d, true
		return nil
	}
}
