package main

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// namesHelp tells, in the help of ls and status, how names and what
// holders recorded are shown (safeText, base64IfInvalid).
const namesHelp = `A name, key, identity, host or command name is shown as it is when it
is plain: printable UTF-8 without a space, a double quote or a
backslash, such as jobs/backup. Any other is shown quoted as in Go
("my lock", "a\nb", "bad\xff"): one word that adds no line or column
and sends the terminal no escape sequence. In JSON, a name or key that is
not valid UTF-8, which JSON cannot carry, also has its exact bytes in
base64 beside it: "name_base64", "key_base64", "waits_for_base64".`

// safeText is s as the text output shows a lock name, key, identity, host
// or command name, which come from etcd or the command line: s itself when
// it is plain (non-empty, valid UTF-8, every character printable, and no
// space, double quote or backslash), else s quoted as in Go
// (strconv.Quote), as the status header quotes a name. A plain field
// cannot end a line or a column, nor hold an escape sequence; a quoted
// one is one word with every such character escaped, and reads back to
// the exact bytes of s (strconv.Unquote). A field that starts with a
// double quote is always a quoted one.
func safeText(s string) string {
	if s == "" || !printable(s) || strings.ContainsAny(s, ` "\\`) {
		return strconv.Quote(s)
	}
	return s
}

// printable reports whether s is valid UTF-8 whose every character is
// printable or a space. A valid U+FFFD counts as not printable, as a byte
// of invalid UTF-8 does, so that escaping keeps the two apart.
func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || (r != ' ' && !strconv.IsPrint(r)) {
			return false
		}
	}
	return true
}

// base64IfInvalid is s in standard base64 when s is not valid UTF-8, and
// "" when it is. JSON carries UTF-8 only (encoding/json writes U+FFFD for
// each bad byte): a name's or a key's exact bytes go beside it in base64,
// as etcdctl's JSON gives every key, so that a script can address the lock.
func base64IfInvalid(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// lineBreaks matches a line break or a tab with the white space around it.
var lineBreaks = regexp.MustCompile(` *[\t\n\v\f\r\x{85}\x{2028}\x{2029}][\t\n\v\f\r \x{85}\x{2028}\x{2029}]*`)

// oneLine keeps a message to one line of text: etcd and gRPC errors can
// span several, and a message may carry, unquoted, what etcd or the
// command line gave. A line break or a tab, with the white space around
// it, becomes one space (spaces alone stay: a quoted name keeps its
// own); any other character that is not printable (a control or format
// character, a byte of invalid UTF-8) is escaped as in Go.
func oneLine(s string) string {
	s = strings.TrimSpace(lineBreaks.ReplaceAllString(s, " "))
	var b strings.Builder
	for s != "" {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case printable(s[:size]):
			b.WriteString(s[:size])
		default:
			q := strconv.QuoteRune(r) // '\x1b'
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[size:]
	}
	return b.String()
}
