package etcdlock

// SetTestHookWait makes m call f, with the key it watches, each time it has
// set up its watches and blocks waiting for its turn.
func SetTestHookWait(m *Mutex, f func(pred string)) { m.testHookWait = f }
