// Command dropfuncs removes top-level functions from a Go file, with
// their doc comments and the imports that only they used: it finds them
// with go/ast, cuts their lines out of the source and formats the rest
// with go/format, so that every other line stays as it was. The run
// script in the directory above uses it on its temporary copy of etcd's
// tests, to leave out tests that cannot compile against etcdlock's
// package. A file left with nothing but imports is removed.
//
//	go build -o dropfuncs dropfuncs/main.go && ./dropfuncs FILE NAME...
//
// It fails if a NAME is not a top-level function of FILE, so that a
// change in etcd's tests is noticed rather than silently ignored.
package main

import (
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"regexp"
	"sort"
	"strconv"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: dropfuncs FILE NAME...")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "dropfuncs:", err)
		os.Exit(1)
	}
}

func run(file string, names []string) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	drop := map[string]bool{}
	for _, n := range names {
		drop[n] = true
	}

	var kept, dropped []ast.Decl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && drop[fd.Name.Name] {
			delete(drop, fd.Name.Name)
			dropped = append(dropped, d)
			continue
		}
		kept = append(kept, d)
	}
	if len(drop) > 0 {
		return fmt.Errorf("%s has no top-level function %v", file, keys(drop))
	}
	if onlyImports(kept) {
		// What is left would be imports that nothing uses, whose names a
		// guess may miss: the file goes whole.
		fmt.Printf("dropfuncs: nothing is left of %s: removed\n", file)
		return os.Remove(file)
	}

	// An import goes only if the dropped functions used it and nothing
	// left does. Its name is its alias, or a guess from its path: a wrong
	// guess keeps the import, and the compiler then says so.
	var cut []span
	usedByDropped, usedByKept := qualifiers(dropped), qualifiers(kept)
	for _, imp := range f.Imports {
		if name := importName(imp); usedByDropped[name] && !usedByKept[name] {
			cut = append(cut, lines(fset, imp.Pos(), imp.End()))
		}
	}
	for _, d := range dropped {
		start := d.Pos()
		if doc := d.(*ast.FuncDecl).Doc; doc != nil {
			start = doc.Pos()
		}
		cut = append(cut, lines(fset, start, d.End()))
	}

	// The rest of the file stays byte for byte: cut whole lines out of the
	// source, and let go/format fold the blank lines left behind.
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	sort.Slice(cut, func(i, j int) bool { return cut[i].from > cut[j].from })
	for _, c := range cut {
		src = append(src[:c.from:c.from], src[c.to:]...)
	}
	out, err := format.Source(src)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}

func onlyImports(decls []ast.Decl) bool {
	for _, d := range decls {
		if gd, ok := d.(*ast.GenDecl); !ok || gd.Tok != token.IMPORT {
			return false
		}
	}
	return true
}

// qualifiers returns the identifiers used as X in X.Sel within decls.
func qualifiers(decls []ast.Decl) map[string]bool {
	used := map[string]bool{}
	for _, d := range decls {
		ast.Inspect(d, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok {
					used[id.Name] = true
				}
			}
			return true
		})
	}
	return used
}

var majorSuffix = regexp.MustCompile(`^v[0-9]+$`)

func importName(imp *ast.ImportSpec) string {
	if imp.Name != nil {
		return imp.Name.Name
	}
	p, _ := strconv.Unquote(imp.Path.Value)
	base := path.Base(p)
	if majorSuffix.MatchString(base) {
		base = path.Base(path.Dir(p))
	}
	return base
}

// span is a range of byte offsets in the source.
type span struct{ from, to int }

// lines widens [pos, end) to whole lines, the final newline included.
func lines(fset *token.FileSet, pos, end token.Pos) span {
	tf := fset.File(pos)
	from := tf.Offset(tf.LineStart(tf.Line(pos)))
	to := tf.Size()
	if l := tf.Line(end); l < tf.LineCount() {
		to = tf.Offset(tf.LineStart(l + 1))
	}
	return span{from, to}
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
