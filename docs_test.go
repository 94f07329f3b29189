package etcdlock_test

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The checks of this file keep the documentation honest: every code block
// of README.md and docs/*.md is checked against code that is compiled and
// run. A Go block must be an excerpt, whole lines in order, of the body of
// an Example function (which go test runs and checks against its Output)
// or of a TestDocs function written for the docs; a shell block's go
// commands must name packages that exist and flags those packages define.
// The etcdlock command's lines are checked against the built command's
// help by cmd/etcdlock's TestDocsCommands.

// docPages returns the pages whose code blocks are checked.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	return append([]string{"README.md"}, pages...)
}

// TestDocsReadmeIsAFrontPage: the README stays a front page, at most 300
// lines; depth lives in docs/.
func TestDocsReadmeIsAFrontPage(t *testing.T) {
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.LessOrEqual(t, strings.Count(string(b), "\n"), 300, "README.md: move depth into docs/")
}

// A codeBlock is one fenced block of a Markdown page.
type codeBlock struct {
	page string
	line int    // of the opening fence
	lang string // as written after the fence: go, sh, or ""
	text []string
}

func (b codeBlock) String() string { return fmt.Sprintf("%s:%d (```%s)", b.page, b.line, b.lang) }

// codeBlocks returns the fenced blocks of a Markdown page, indented ones
// (in list items) included.
func codeBlocks(t *testing.T, page string) []codeBlock {
	t.Helper()
	f, err := os.Open(page)
	require.NoError(t, err)
	defer f.Close()
	var (
		blocks []codeBlock
		cur    *codeBlock
		indent string
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		if strings.HasPrefix(trimmed, "```") {
			if cur == nil {
				indent = line[:len(line)-len(trimmed)]
				cur = &codeBlock{page: page, line: n, lang: strings.TrimSpace(trimmed[3:])}
			} else {
				blocks = append(blocks, *cur)
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.text = append(cur.text, strings.TrimPrefix(line, indent))
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a code block is not closed", page)
	return blocks
}

// normalized returns lines without blank ones, each with its runs of
// white space made one space: indentation and alignment do not count.
func normalized(lines []string) []string {
	var out []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, strings.Join(f, " "))
		}
	}
	return out
}

// checkedBodies returns, by function name, the normalized bodies of the
// Example and TestDocs functions in the _test.go files of dirs.
func checkedBodies(t *testing.T, dirs ...string) map[string][]string {
	t.Helper()
	bodies := map[string][]string{}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NoError(t, err)
		for _, path := range files {
			src, err := os.ReadFile(path)
			require.NoError(t, err)
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
			require.NoError(t, err)
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil || fn.Recv != nil ||
					!strings.HasPrefix(fn.Name.Name, "Example") && !strings.HasPrefix(fn.Name.Name, "TestDocs") {
					continue
				}
				from := fset.Position(fn.Body.Lbrace).Offset + 1
				to := fset.Position(fn.Body.Rbrace).Offset
				bodies[filepath.Join(dir, fn.Name.Name)] = normalized(strings.Split(string(src[from:to]), "\n"))
			}
		}
	}
	return bodies
}

// excerptOf returns the name of a body that has block's lines as a run of
// its own, or "".
func excerptOf(block []string, bodies map[string][]string) string {
	for _, name := range slices.Sorted(maps.Keys(bodies)) {
		body := bodies[name]
		for i := 0; i+len(block) <= len(body); i++ {
			if slices.Equal(body[i:i+len(block)], block) {
				return name
			}
		}
	}
	return ""
}

// TestDocsGoBlocks checks that every Go block of the docs is an excerpt of
// an Example or a TestDocs function, so that it compiles and runs.
func TestDocsGoBlocks(t *testing.T) {
	bodies := checkedBodies(t, ".", "concurrency", "etcdlockprom", "etcdlockotel", "etcdlockgocron", "etcdlocksql")
	require.NotEmpty(t, bodies)
	checked := 0
	for _, page := range docPages(t) {
		for _, b := range codeBlocks(t, page) {
			if b.lang != "go" {
				continue
			}
			checked++
			block := normalized(b.text)
			if len(block) == 0 {
				t.Errorf("%v: empty Go block", b)
				continue
			}
			if excerptOf(block, bodies) == "" {
				t.Errorf("%v: this Go block is not an excerpt (whole lines, in order) of any Example or TestDocs function "+
					"of the root package, concurrency, etcdlockprom, etcdlockotel, etcdlockgocron or etcdlocksql: copy it from one, or write one that runs it. It begins:\n\t%s",
					b, strings.Join(b.text[:min(3, len(b.text))], "\n\t"))
			}
		}
	}
	require.NotZero(t, checked, "no Go block found: is the parser broken?")
}

// TestDocsInjector runs the Injector snippet of docs/testing.md: a queue
// of nested keys spans two pages of the Mutex's reads (8 keys a page), and
// another session locks between the Try's two reads.
func TestDocsInjector(t *testing.T) {
	ctx := t.Context()
	name := lockName(t)
	putNested(t, newClient(t), name, 9)
	other := etcdlock.NewMutex(newSession(t, newClient(t)), name)

	var in etcdtest.Injector
	cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	m := etcdlock.NewMutex(newSession(t, cli), name)
	// Before the Try's second read (its second page), another session locks.
	in.At(etcdtest.Nth(2, unary), etcdtest.Action{Before: func(etcdtest.RPC) {
		require.NoError(t, other.Lock(ctx))
	}})
	require.ErrorIs(t, m.TryLock(ctx), etcdlock.ErrLocked)
}

// goTestFlags are go test's and go build's own flags, which need no
// definition in the package tested.
var goTestFlags = strings.Fields(`run bench benchtime benchmem count cpu failfast fullpath json list
	parallel short shuffle skip timeout v vet race msan asan cover covermode coverpkg coverprofile
	cpuprofile memprofile blockprofile mutexprofile trace outputdir c o exec tags ldflags gcflags
	mod modfile p x n work a trimpath buildvcs`)

// shellCommands returns the simple commands of a shell block, each as its
// words: lines joined where they end in \, split at && || ; and |.
func shellCommands(text []string) [][]string {
	var cmds [][]string
	joined := strings.Join(text, "\n")
	joined = strings.ReplaceAll(joined, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		var cmd []string
		for _, w := range etcdtest.ShellWords(line) {
			if w == "&&" || w == "||" || w == ";" || w == "|" {
				if len(cmd) > 0 {
					cmds = append(cmds, cmd)
				}
				cmd = nil
				continue
			}
			cmd = append(cmd, w)
		}
		if len(cmd) > 0 {
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

var envAssign = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=`)

// flagDefined reports whether the Go files of dir define the flag name
// (flag.String("name", ...), fs.Bool("name", ...), flag.Var(v, "name", ...)).
func flagDefined(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	def := regexp.MustCompile(`\.(Bool|Int|Int64|Uint|Uint64|String|Float64|Duration|Func|BoolFunc|TextVar|Var|BoolVar|IntVar|Int64Var|UintVar|Uint64Var|StringVar|Float64Var|DurationVar)\((?:[^"()]*, *)?"` + regexp.QuoteMeta(name) + `"`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		if def.Match(src) {
			return true
		}
	}
	return false
}

// goFileMentions reports whether a .go file of the repository (outside
// testdata) contains s.
func goFileMentions(t *testing.T, s string) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || found {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			found = strings.Contains(string(src), s)
		}
		return nil
	})
	require.NoError(t, err)
	return found
}

// checkGoCommand checks one go command of a shell block: the packages it
// names exist, and the flags it gives them are defined there.
func checkGoCommand(t *testing.T, b codeBlock, cmd []string) {
	t.Helper()
	if len(cmd) < 2 {
		return
	}
	verb, args := cmd[1], cmd[2:]
	isPkg := func(a string) bool { return a == "." || strings.HasPrefix(a, "./") }
	var pkgs []string
	for _, a := range args {
		if isPkg(a) {
			pkgs = append(pkgs, a)
		}
	}
	for _, p := range pkgs {
		dir := strings.TrimSuffix(strings.TrimSuffix(p, "..."), "/")
		if dir == "" {
			dir = "."
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("%v: `%s` names package %s, which does not exist", b, strings.Join(cmd, " "), p)
		}
	}
	switch verb {
	case "run":
		// go run [build flags] PKG [program flags]
		i := slices.IndexFunc(args, isPkg)
		if i < 0 {
			return
		}
		for _, a := range args[i+1:] {
			if name, ok := flagName(a); ok && !flagDefined(t, args[i], name) {
				t.Errorf("%v: `%s`: %s defines no flag -%s", b, strings.Join(cmd, " "), args[i], name)
			}
		}
	case "test":
		// Flags go test does not know go to the test binary: the package
		// (one, not ./...) must define them.
		var dir string
		if len(pkgs) == 1 && !strings.HasSuffix(pkgs[0], "...") {
			dir = pkgs[0]
		}
		afterArgs := false
		for _, a := range args {
			if a == "-args" {
				afterArgs = true
				continue
			}
			name, ok := flagName(a)
			if !ok || !afterArgs && (slices.Contains(goTestFlags, name) || strings.HasPrefix(name, "test.")) {
				continue
			}
			if dir == "" || !flagDefined(t, dir, name) {
				t.Errorf("%v: `%s`: -%s is neither go test's flag nor one the tested package defines", b, strings.Join(cmd, " "), name)
			}
		}
	}
}

// flagName returns the name of a flag word: -name, --name, -name=value.
func flagName(w string) (string, bool) {
	if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
		return "", false
	}
	name := strings.TrimLeft(w, "-")
	name, _, _ = strings.Cut(name, "=")
	return name, name != ""
}

// TestDocsShellBlocks checks the go commands of the docs' shell blocks:
// packages that exist, flags they define, ETCDLOCK_ variables the code
// reads. (The etcdlock command's lines: cmd/etcdlock's TestDocsCommands.)
func TestDocsShellBlocks(t *testing.T) {
	checked := 0
	for _, page := range docPages(t) {
		for _, b := range codeBlocks(t, page) {
			if b.lang != "sh" {
				continue
			}
			for _, cmd := range shellCommands(b.text) {
				for len(cmd) > 0 && envAssign.MatchString(cmd[0]) {
					if v := envAssign.FindStringSubmatch(cmd[0])[1]; strings.HasPrefix(v, "ETCDLOCK_") && !goFileMentions(t, `"`+v+`"`) {
						t.Errorf("%v: no Go file reads the variable %s", b, v)
					}
					cmd = cmd[1:]
				}
				if len(cmd) > 0 && cmd[0] == "go" {
					checked++
					checkGoCommand(t, b, cmd)
				}
			}
		}
	}
	require.NotZero(t, checked, "no go command found: is the parser broken?")
}

// TestDocsReadmeCommands checks the README's two commands: the first shell
// block runs the demo and the tests, and .ci/run runs that same test
// command (with -count=1, so that CI never reuses a cached result).
func TestDocsReadmeCommands(t *testing.T) {
	var first codeBlock
	for _, b := range codeBlocks(t, "README.md") {
		if b.lang == "sh" {
			first = b
			break
		}
	}
	cmds := shellCommands(first.text)
	require.Len(t, cmds, 2, "%v: the README's first block is its two commands", first)
	require.Equal(t, []string{"go", "run", "./cmd/etcdlock", "demo"}, cmds[0], "%v: the demo", first)
	readmeTest := cmds[1]
	require.Equal(t, []string{"go", "test"}, readmeTest[:2], "%v: the test command", first)

	ci, err := os.ReadFile(".ci/run")
	require.NoError(t, err)
	lines := strings.Split(string(ci), "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, `step "README test command"`) })
	require.GreaterOrEqual(t, i, 0, ".ci/run has no step \"README test command\"")
	require.Less(t, i+1, len(lines))
	ciTest := slices.DeleteFunc(etcdtest.ShellWords(lines[i+1]), func(w string) bool { return w == "-count=1" })
	require.Equal(t, readmeTest, ciTest, ".ci/run's README test command is not the README's")
}

// TestDocsLinks checks the relative links of the docs: the file exists,
// and an #anchor names a heading of it (as GitHub makes anchors).
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		a := map[string]bool{}
		src, err := os.ReadFile(page)
		require.NoError(t, err)
		inBlock := false
		for _, l := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				inBlock = !inBlock
			}
			if inBlock || !strings.HasPrefix(l, "#") {
				continue
			}
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
			h = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(h, "")
			a[strings.ReplaceAll(h, " ", "-")] = true
		}
		anchors[page] = a
		return a
	}
	checked := 0
	for _, page := range docPages(t) {
		src, err := os.ReadFile(page)
		require.NoError(t, err)
		for n, l := range strings.Split(string(src), "\n") {
			for _, m := range link.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s:%d: link to %s: no such file", page, n+1, target)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[anchor] {
					t.Errorf("%s:%d: link to %s: %s has no heading with anchor #%s", page, n+1, target, path, anchor)
				}
			}
		}
	}
	require.NotZero(t, checked, "no relative link found: is the parser broken?")
}
