package etcdlockotel

import "time"

// OpenHolds returns the number of hold spans t keeps: started, and not
// yet ended by their HoldDone.
func (t *Telemetry) OpenHolds() int {
	t.spansMu.Lock()
	defer t.spansMu.Unlock()
	return len(t.holds)
}

// SetNow makes t read the time from now, for the ages of its holds.
func SetNow(t *Telemetry, now func() time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now = now
}
