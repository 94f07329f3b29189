package etcdlockotel

// OpenHolds returns the number of hold spans t keeps: started, and not
// yet ended by their HoldDone.
func (t *Telemetry) OpenHolds() int {
	t.spansMu.Lock()
	defer t.spansMu.Unlock()
	return len(t.holds)
}
