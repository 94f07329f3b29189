package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// TestDocsCommands checks every etcdlock command line of the README and
// docs/*.md against the built command: its subcommand exists ('etcdlock
// help SUB' succeeds) and each flag it gives is one that subcommand's help
// lists. The lines checked are those of shell blocks (also 'go run
// ./cmd/etcdlock ...'), "$ etcdlock ..." in output blocks, and inline
// `etcdlock ...` code in the text.
func TestDocsCommands(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	pages = append([]string{"../../README.md"}, pages...)

	helps := map[string]map[string]bool{} // flags by subcommand; nil: unknown
	flagsOf := func(sub string) map[string]bool {
		if f, ok := helps[sub]; ok {
			return f
		}
		out, err := exec.Command(bin, "help", sub).Output()
		var flags map[string]bool
		if err == nil {
			flags = map[string]bool{"help": true, "h": true}
			for _, m := range regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
				flags[m[1]] = true
			}
		}
		helps[sub] = flags
		return flags
	}

	checked := 0
	for _, page := range pages {
		for _, l := range commandLines(t, page) {
			checked++
			words := etcdtest.ShellWords(l.text)
			sub := ""
			for _, w := range words {
				if !strings.HasPrefix(w, "-") {
					sub = w
					break
				}
			}
			if sub == "" {
				t.Errorf("%s:%d: `%s` names no subcommand", page, l.line, l.text)
				continue
			}
			flags := flagsOf(sub)
			if flags == nil {
				t.Errorf("%s:%d: `%s`: etcdlock has no subcommand %q ('etcdlock help %s' fails)", page, l.line, l.text, sub, sub)
				continue
			}
			for _, w := range words {
				if w == "--" {
					break // CMD's own arguments follow
				}
				if !strings.HasPrefix(w, "-") || w == "-" {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimLeft(w, "-"), "=")
				if !flags[name] {
					t.Errorf("%s:%d: `%s`: 'etcdlock %s' has no flag --%s", page, l.line, l.text, sub, name)
				}
			}
		}
	}
	require.NotZero(t, checked, "no etcdlock command found in the docs: is the parser broken?")
}

// A docLine is an etcdlock command line of a page: the words after
// "etcdlock".
type docLine struct {
	line int
	text string
}

var (
	inlineCmd = regexp.MustCompile("`etcdlock ([^`]+)`")
	shellCmd  = regexp.MustCompile(`^(?:\$ )?(?:[A-Z_]+=\S+ )*(?:etcdlock|go run \./cmd/etcdlock) (.*)$`)
)

// commandLines returns the etcdlock command lines of a Markdown page.
func commandLines(t *testing.T, page string) []docLine {
	t.Helper()
	f, err := os.Open(page)
	require.NoError(t, err)
	defer f.Close()
	var (
		lines   []docLine
		inBlock bool
		lang    string
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(text, "```") {
			inBlock, lang = !inBlock, strings.TrimSpace(text[3:])
			continue
		}
		switch {
		case inBlock && lang == "sh":
			// Commands joined by && or ; are checked one by one.
			for _, part := range regexp.MustCompile(`&&|;|\|\|`).Split(text, -1) {
				if m := shellCmd.FindStringSubmatch(strings.TrimSpace(part)); m != nil {
					lines = append(lines, docLine{n, m[1]})
				}
			}
		case inBlock:
			// Output blocks: only the prompted lines are commands.
			if strings.HasPrefix(text, "$ ") {
				if m := shellCmd.FindStringSubmatch(text); m != nil {
					lines = append(lines, docLine{n, m[1]})
				}
			}
		default:
			for _, m := range inlineCmd.FindAllStringSubmatch(text, -1) {
				lines = append(lines, docLine{n, m[1]})
			}
		}
	}
	require.NoError(t, sc.Err())
	return lines
}
