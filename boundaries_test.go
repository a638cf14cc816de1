package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpu-injector/gpu-injector"

// TestProductBoundaries keeps the folders true to the architecture. Product
// packages (every package of Go code outside hack/ and e2e/, the binary's
// among them) and their tests never link hack/ or e2e/: those are tools and
// a harness around the product, never under it. A package of tests alone
// (charts/, the chart's tests) is a suite like e2e/'s. Fixtures
// (internal/testfixtures: fake host roots, load workloads) are linked by
// tests, test helpers (packages that link package testing) and tools only.
// The release image is built and signed without the e2e harness, status reads the pool
// memory through its contract without the webhook's node index, and the
// probe and the NRI plugin meet only in their contract (layout/statedir).
func TestProductBoundaries(t *testing.T) {
	pkgs, suites := listDeps(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages, fewer than the module has", len(pkgs))
	}
	tools := []string{module + "/hack", module + "/e2e"}
	fixtures := []string{module + "/internal/testfixtures"}
	arrows := map[string][]string{
		// The binary and the packages it runs.
		module:                 fixtures,
		module + "/hack/image": {module + "/e2e"},
		module + "/hack/sign":  {module + "/e2e"},
		module + "/status":     {module + "/webhook"},
		module + "/nodeprobe":  {module + "/nriplugin"},
		module + "/nriplugin":  {module + "/nodeprobe"},
	}
	checked := 0
	for name, deps := range pkgs {
		pkg, test := strings.CutSuffix(name, ".test")
		if under(pkg, tools) || suites[pkg] {
			continue
		}
		checked++
		helper := slices.Contains(deps, "testing")
		for _, dep := range deps {
			if under(dep, tools) {
				t.Errorf("%s links %s: product code, tests included, never links hack/ or e2e/", name, dep)
			}
			if !test && !helper && !under(pkg, fixtures) && under(dep, fixtures) {
				t.Errorf("%s links the fixture %s outside tests", pkg, dep)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no product package was checked")
	}
	for pkg, trees := range arrows {
		deps, ok := pkgs[pkg]
		if !ok {
			t.Errorf("%s is not in the module", pkg)
			continue
		}
		for _, dep := range deps {
			if under(dep, trees) {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

// under reports whether pkg is one of trees or below one.
func under(pkg string, trees []string) bool {
	for _, tr := range trees {
		if pkg == tr || strings.HasPrefix(pkg, tr+"/") {
			return true
		}
	}
	return false
}

// listDeps maps each package of the module to what it links, and each
// package's test binary ("pkg.test") to what its tests link, as
// `go list -deps -test` would list them. suites are the packages of tests
// alone.
func listDeps(t *testing.T) (pkgs map[string][]string, suites map[string]bool) {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	format := `{{.ImportPath}}{{"\t"}}{{len .GoFiles}}{{"\t"}}{{join .Deps ","}}`
	out, err := exec.Command(goCmd, "list", "-test", "-f", format, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list -test %s/...: %v", module, err)
	}
	pkgs, suites = map[string][]string{}, map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("go list printed %q", line)
		}
		name, files, deps := f[0], f[1], f[2]
		if strings.Contains(name, " [") {
			// A package recompiled for its tests: the test binary's list
			// ("pkg.test") already holds what it links.
			continue
		}
		for _, d := range strings.Split(deps, ",") {
			// A dependency recompiled for a test is named "dep [pkg.test]".
			d, _, _ = strings.Cut(d, " [")
			if d != "" {
				pkgs[name] = append(pkgs[name], d)
			}
		}
		if _, ok := pkgs[name]; !ok {
			pkgs[name] = nil
		}
		if files == "0" && !strings.HasSuffix(name, ".test") {
			suites[name] = true
		}
	}
	return pkgs, suites
}
