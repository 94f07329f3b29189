package etcdtest

import "strings"

// ShellWords splits a documented shell command line into its words, for
// the tests that check the docs' commands: quotes are removed, "$(...)"
// and variables are kept as written, and a # or a | outside a word ends
// the line (a comment; a pipe, whose next command the caller splits off
// itself if it wants it).
func ShellWords(line string) []string {
	var (
		words []string
		cur   strings.Builder
		in    bool // a word is under way
		quote rune
	)
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case (r == '#' || r == '|') && !in:
			return words
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
