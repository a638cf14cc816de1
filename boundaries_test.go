package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/gpu-injector/gpu-injector"

// The trees the boundaries are drawn between: a path and everything below it.
var (
	// tools are the tools and the harness around the product, never under it.
	tools = []string{module + "/hack", module + "/e2e"}
	// fixtures (fake host roots, load workloads) are the one part of tools
	// that tests and test helpers may link.
	fixtures = []string{module + "/hack/testfixtures"}
	// floor is the contract every component reads: it stands on nothing of
	// ours, so that the configuration and the components may import it.
	floor = []string{module + "/layout"}
	// libraries are the product's shared libraries, each of them used by it.
	libraries = []string{module + "/internal"}
)

// TestProductBoundaries keeps the folders true to the architecture. Product
// packages (every package of Go code outside hack/ and e2e/ that is not a
// test helper, the binary's among them) never link hack/, e2e/ or a test
// helper (a package whose own files import package testing); their tests and
// the test helpers link the fixtures of hack/testfixtures and nothing else of
// hack/ or e2e/. A package of tests alone (charts/, the
// chart's tests) is a suite like e2e/'s. The release image is built and
// signed without the e2e harness, status reads the pool memory through its
// contract without the webhook's node index, and the probe and the NRI plugin
// meet only in their contract (layout/statedir).
func TestProductBoundaries(t *testing.T) {
	mod := listModule(t)
	checked := 0
	for name, p := range mod {
		pkg, test := strings.CutSuffix(name, ".test")
		if under(pkg, tools) || mod[pkg].suite {
			continue
		}
		checked++
		product := !test && !p.helper()
		for _, dep := range p.deps {
			switch {
			case under(dep, tools) && !under(dep, fixtures):
				t.Errorf("%s links %s: product code, its tests and test helpers link nothing of hack/ or e2e/ but the fixtures", name, dep)
			case product && under(dep, fixtures):
				t.Errorf("%s links the fixture %s outside tests and test helpers", pkg, dep)
			case product && mod[dep].helper():
				t.Errorf("%s links the test helper %s outside tests", pkg, dep)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no product package was checked")
	}
	if slices.Contains(mod[module].deps, "testing") {
		t.Errorf("%s links package testing: a test helper is in the binary", module)
	}
	arrows := map[string][]string{
		module + "/hack/image": {module + "/e2e"},
		module + "/hack/sign":  {module + "/e2e"},
		module + "/status":     {module + "/webhook"},
		module + "/nodeprobe":  {module + "/nriplugin"},
		module + "/nriplugin":  {module + "/nodeprobe"},
	}
	for pkg, trees := range arrows {
		p, ok := mod[pkg]
		if !ok {
			t.Errorf("%s is not in the module", pkg)
			continue
		}
		for _, dep := range p.deps {
			if under(dep, trees) {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

// TestGroundFloor keeps the layout contract, and its tests, free of every
// other package of the module: a third party reads it without the rest.
func TestGroundFloor(t *testing.T) {
	mod := listModule(t)
	checked := 0
	for name, p := range mod {
		if !under(strings.TrimSuffix(name, ".test"), floor) {
			continue
		}
		checked++
		for _, dep := range p.deps {
			if under(dep, []string{module}) && !under(dep, floor) {
				t.Errorf("%s links %s: the contract imports nothing of ours outside layout/", name, dep)
			}
		}
	}
	if checked == 0 {
		t.Fatalf("no package under %s was found", floor[0])
	}
}

// TestInternalHoldsProductLibraries keeps internal/ for the product's own
// libraries: every package there is imported by a product package, so a
// fixture, a test helper or a tool's library lives beside its users instead.
func TestInternalHoldsProductLibraries(t *testing.T) {
	mod := listModule(t)
	importers := map[string][]string{}
	for name, p := range mod {
		if strings.HasSuffix(name, ".test") || under(name, tools) || p.suite || p.helper() {
			continue
		}
		for _, imp := range p.imports {
			importers[imp] = append(importers[imp], name)
		}
	}
	checked := 0
	for name, p := range mod {
		if !under(name, libraries) || strings.HasSuffix(name, ".test") || p.suite {
			continue
		}
		checked++
		if len(importers[name]) == 0 {
			t.Errorf("%s is imported by no product package: move it beside its users", name)
		}
	}
	if checked == 0 {
		t.Fatalf("no package under %s was found", libraries[0])
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

// pkgInfo is what `go list -test` says of a package or of a test binary
// ("pkg.test").
type pkgInfo struct {
	// deps is what it links, the packages of a test binary's tests named as
	// the package they test.
	deps []string
	// imports is what its own files import; nil for a test binary.
	imports []string
	// suite is a package of tests alone.
	suite bool
}

// helper reports whether a package is a test helper: its own files import
// package testing.
func (p pkgInfo) helper() bool { return slices.Contains(p.imports, "testing") }

var (
	moduleOnce sync.Once
	modulePkgs map[string]pkgInfo
	moduleErr  string
)

// listModule maps each package of the module, and each package's test
// binary, to what go list says of it; it runs go list once for all tests.
func listModule(t *testing.T) map[string]pkgInfo {
	t.Helper()
	moduleOnce.Do(func() { modulePkgs, moduleErr = goList() })
	if moduleErr != "" {
		t.Fatal(moduleErr)
	}
	if len(modulePkgs) < 20 {
		t.Fatalf("go list found %d packages, fewer than the module has", len(modulePkgs))
	}
	return modulePkgs
}

func goList() (map[string]pkgInfo, string) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	format := `{{.ImportPath}}{{"\t"}}{{len .GoFiles}}{{"\t"}}{{join .Imports ","}}{{"\t"}}{{join .Deps ","}}`
	out, err := exec.Command(goCmd, "list", "-test", "-f", format, module+"/...").Output()
	if err != nil {
		return nil, "go list -test " + module + "/...: " + err.Error()
	}
	pkgs := map[string]pkgInfo{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) != 4 {
			return nil, "go list printed " + line
		}
		name, files, imports, deps := f[0], f[1], f[2], f[3]
		if strings.Contains(name, " [") {
			// A package recompiled for its tests: the test binary's list
			// ("pkg.test") already holds what it links.
			continue
		}
		var p pkgInfo
		for _, d := range strings.Split(deps, ",") {
			// A dependency recompiled for a test is named "dep [pkg.test]",
			// and a package's external tests "pkg_test".
			d, _, _ = strings.Cut(d, " [")
			if d != "" {
				p.deps = append(p.deps, strings.TrimSuffix(d, "_test"))
			}
		}
		test := strings.HasSuffix(name, ".test")
		if !test && imports != "" {
			p.imports = strings.Split(imports, ",")
		}
		p.suite = files == "0" && !test
		pkgs[name] = p
	}
	return pkgs, ""
}

// TestWebhookBoundaries keeps the arrows between the webhook's rooms one way
// (docs/webhook.md): the folder webhook/ is only a folder of packages, the
// injection talks to no cluster, the node index never reaches into the
// admission server, the builder of the decision's input and its offline
// sources stand below the server, and the offline commands (`gpu-injector
// mutate`, `status`, `status pod`, `precheck`) link neither the server nor
// what only it needs.
func TestWebhookBoundaries(t *testing.T) {
	entries, err := os.ReadDir("webhook")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			t.Errorf("webhook/%s: the folder webhook/ holds packages, no Go file of its own", e.Name())
		}
	}
	const (
		server     = module + "/webhook/server"
		gpunodes   = module + "/webhook/gpunodes"
		admitinput = module + "/webhook/admitinput"
	)
	// Trees: a path and everything below it.
	cluster := []string{"k8s.io/client-go", "sigs.k8s.io/controller-runtime", "k8s.io/apiserver", "net/http/httptest"}
	serving := []string{server, "github.com/open-policy-agent/cert-controller", "sigs.k8s.io/controller-runtime/pkg/manager", "sigs.k8s.io/controller-runtime/pkg/webhook"}
	tests := map[string]struct {
		packages, trees []string
	}{
		module + "/webhook/inject": {[]string{server, gpunodes, admitinput}, cluster},
		gpunodes:                   {[]string{server, admitinput}, nil},
		admitinput:                 {[]string{gpunodes}, serving},
		admitinput + "/...":        {nil, serving},
		module + "/mutate":         {nil, serving},
		module + "/podstatus":      {nil, serving},
		module + "/status":         {nil, serving},
		module + "/precheck":       {nil, serving},
	}
	for pattern, tc := range tests {
		t.Run(strings.TrimPrefix(pattern, module+"/"), func(t *testing.T) {
			for _, dep := range linked(t, pattern) {
				if slices.Contains(tc.packages, dep) || under(dep, tc.trees) {
					t.Errorf("%s links %s", pattern, dep)
				}
			}
		})
	}
}

// linked lists what the packages of pattern link, themselves included, as
// `go list -deps` does: without their tests.
func linked(t *testing.T, pattern string) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goCmd, "list", "-deps", pattern).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	list := strings.Fields(string(out))
	if len(list) == 0 {
		t.Fatalf("go list -deps %s listed nothing", pattern)
	}
	return list
}
