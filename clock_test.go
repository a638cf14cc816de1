package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestProductReadsTimeFromAClock keeps the time of product code settable by
// tests: product code (everything outside hack/, e2e/ and tests) never calls
// time.Now, time.Since or time.Until, nor makes a clock.RealClock, but takes
// a clock (k8s.io/utils/clock) whose default is wallclock.Real. Together
// with the unit stage's second run under the clockskew tag, which moves
// wallclock.Real a year ahead, a test that builds fixed dates while some
// product path reads the real clock fails on any day. A call that must read
// the real clock (a connection's deadline) says why on the line above, in a
// comment that starts "wallclock:".
func TestProductReadsTimeFromAClock(t *testing.T) {
	forbidden := map[string]map[string]bool{
		"time":               {"Now": true, "Since": true, "Until": true},
		"k8s.io/utils/clock": {"RealClock": true},
	}
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch path {
			case "hack", "e2e", filepath.Join("internal", "wallclock"):
				return filepath.SkipDir
			}
			if path != "." && strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "_output" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		checked++
		names := map[string]map[string]bool{}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[p] == nil {
				continue
			}
			name := filepath.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			names[name] = forbidden[p]
		}
		if len(names) == 0 {
			return nil
		}
		excused := map[int]bool{}
		for _, g := range f.Comments {
			for _, c := range g.List {
				if strings.HasPrefix(strings.TrimPrefix(c.Text, "//"), " wallclock:") {
					excused[fset.Position(c.End()).Line+1] = true
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || !names[pkg.Name][sel.Sel.Name] {
				return true
			}
			if pos := fset.Position(sel.Pos()); !excused[pos.Line] {
				t.Errorf("%s: %s.%s in product code: take a clock (k8s.io/utils/clock), defaulting to wallclock.Real, so that tests can set it", pos, pkg.Name, sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d product files, fewer than the module has", checked)
	}
}
