package etcdlock

import "testing"

// TestIdentityOf: an identity is read only after a mode line as etcdlock
// writes it; an election's proposal or a JSON record of several lines has
// none, and the mode of every value stays what it was.
func TestIdentityOf(t *testing.T) {
	for _, c := range []struct{ value, identity, mode string }{
		{"", "", "exclusive"},
		{"\n", "", "exclusive"},
		{"\nhost-a", "host-a", "exclusive"},
		{"\nhost-a\nline 2", "host-a\nline 2", "exclusive"},
		{"etcdlock/1 shared", "", "shared"},
		{"etcdlock/1 shared\nr1", "r1", "shared"},
		{"etcdlock/1 permits 2 of 5\ns", "s", "2 of 5"},
		{"etcdlock/1 permits 02 of 5\ns", "", "exclusive"},
		{"10.0.0.1:8080", "", "exclusive"},
		{"proposal\nsecond line", "", "exclusive"},
		{`{"since":"2026-11-22T12:00:00Z"}`, "", "exclusive"},
		// A MultiMutex's key: a set line, read as exclusive, then the
		// identity.
		{`etcdlock/1 set "b"`, "", "exclusive"},
		{"etcdlock/1 set \"b\"\nhost-a", "host-a", "exclusive"},
		{"etcdlock/1 set b\nhost-a", "", "exclusive"}, // not quoted: not ours
	} {
		if got := identityOf([]byte(c.value)); got != c.identity {
			t.Errorf("identityOf(%q) = %q, want %q", c.value, got, c.identity)
		}
		if got := ParseKeyMode([]byte(c.value)).String(); got != c.mode {
			t.Errorf("ParseKeyMode(%q) = %s, want %s", c.value, got, c.mode)
		}
	}
}

// TestReservedPrefixes: the library's own keys lie under the one range
// that names may not take; the exported prefixes spell their values out,
// so that go doc shows them.
func TestReservedPrefixes(t *testing.T) {
	for _, p := range []string{LockDelayPrefix, ReleaseRequestPrefix} {
		if len(p) <= len(reservedPrefix) || p[:len(reservedPrefix)] != reservedPrefix {
			t.Errorf("%q is not under %q", p, reservedPrefix)
		}
		if checkName(p[:len(p)-1]) == nil {
			t.Errorf("the name %q is accepted", p[:len(p)-1])
		}
	}
}
