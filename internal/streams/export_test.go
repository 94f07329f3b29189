package streams

// BreakStream ends the open Watch stream of w, if any, as if it had
// broken: the next one opens after the runner's pause.
func (w *Watches) BreakStream() {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.s != nil {
		w.s.r.GiveUp()
	}
}
