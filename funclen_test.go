package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines is how long a function of product code may be: each reads as
// a few named steps, short enough to follow at once; a longer one is split
// along its phases.
const maxFuncLines = 80

// TestFunctionsAreShort: every function of every product package is under
// maxFuncLines lines, from its func keyword to its closing brace.
func TestFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()
	pkgs := productFiles(t, fset)
	if len(pkgs) < 20 {
		t.Fatalf("found %d product packages, fewer than the module has", len(pkgs))
	}
	n := 0
	for _, dir := range slices.Sorted(maps.Keys(pkgs)) {
		for _, f := range pkgs[dir] {
			for _, fn := range funcs(f) {
				n++
				start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
				if lines := end.Line - start.Line + 1; lines >= maxFuncLines {
					t.Errorf("%s:%d: %s is %d lines, want under %d", start.Filename, start.Line, funcName(fn), lines, maxFuncLines)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no function found")
	}
}

// productFiles parses the non-test Go files of every product package, by
// the package's folder, every build constraint's files among them. Product
// code is what TestProductBoundaries calls so: none of tools (hack/, its
// fixtures among them, and e2e/), no test helper (a package whose own files
// import package testing), and nothing under a folder named testdata.
func productFiles(t *testing.T, fset *token.FileSet) map[string][]*ast.File {
	t.Helper()
	pkgs := map[string][]*ast.File{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || under(module+"/"+filepath.ToSlash(path), tools)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		pkgs[dir] = append(pkgs[dir], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir, files := range pkgs {
		if slices.ContainsFunc(files, importsTesting) {
			delete(pkgs, dir)
		}
	}
	return pkgs
}

// importsTesting reports whether f imports package testing: a test
// helper's file.
func importsTesting(f *ast.File) bool {
	return slices.ContainsFunc(f.Imports, func(s *ast.ImportSpec) bool {
		path, err := strconv.Unquote(s.Path.Value)
		return err == nil && path == "testing"
	})
}

// funcs are f's functions: its declared functions and methods, and the
// function literals of its package-level declarations (a literal inside a
// function counts in that function's length).
func funcs(f *ast.File) []ast.Node {
	var out []ast.Node
	for _, decl := range f.Decls {
		if fd, ok := decl.(*ast.FuncDecl); ok {
			out = append(out, fd)
			continue
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			if fl, ok := n.(*ast.FuncLit); ok {
				out = append(out, fl)
				return false
			}
			return true
		})
	}
	return out
}

// funcName names fn as a reader looks it up: Recv.Name for a method.
func funcName(fn ast.Node) string {
	fd, ok := fn.(*ast.FuncDecl)
	if !ok {
		return "a function literal"
	}
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if ix, ok := typ.(*ast.IndexListExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
