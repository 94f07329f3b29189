package etcdlock

import "context"

// The guards' seam at admission: the features that act once a hold is
// admitted, before Lock returns it, and that check the options they came
// with. A plain lock carries none; each guard lives in its feature's file
// (the lock delay's record: delay.go; the max hold: maxhold.go; the
// minimum hold: minhold.go), and the engine knows them only as a guard.

// A guard is a feature that the queue consults at named stages of every
// Lock and TryLock of a lock that asked for it.
type guard interface {
	// check is validate's stage: it refuses the options it came with
	// where they make no sense for q (ErrInvalidOption).
	check(q *queue) error
	// admitted is take's stage, once the queue admitted h and before the
	// hold is q's; recorded says the write that admitted h wrote its
	// record. On an error take removes h's key (fail) and returns it as
	// the Lock's.
	admitted(ctx context.Context, q *queue, h *hold, recorded bool) error
}

// guardsOf returns the guards that o asks for, in the order take consults
// them: the record first (the lock delay's and the minimum hold's), then
// the max hold's lease, then the minimum hold's end. None for a lock made
// without those options, whose Lock then pays for no guard.
func guardsOf(o *mutexOptions) []guard {
	var gs []guard
	if o.records {
		gs = append(gs, recordGuard{})
	}
	if o.maxHold > 0 {
		gs = append(gs, maxHoldGuard{})
	}
	if o.minHold > 0 {
		gs = append(gs, minHoldGuard{})
	}
	return gs
}
