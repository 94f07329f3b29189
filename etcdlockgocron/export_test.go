package etcdlockgocron

import "github.com/etcdlock/etcdlock"

// SessionOf returns l's current session, nil before its first Lock.
func SessionOf(l *Locker) *etcdlock.Session {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s
}
