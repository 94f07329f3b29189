package etcdlockprom

import "time"

// SetNow makes m read the time from now, for the ages of its holds.
func SetNow(m *Metrics, now func() time.Time) { m.now = now }
