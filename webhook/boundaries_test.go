package webhook

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/gpu-injector/gpu-injector"

// TestPackageBoundaries keeps the arrows between the webhook's rooms one
// way (docs/webhook.md): the injection talks to no cluster, the node index
// never reaches into the admission server, the builder of the decision's
// input and its offline sources stand below the server, and the offline
// commands (`gpu-injector mutate`, `status pod`, `precheck`) link neither
// the server nor what only it needs.
func TestPackageBoundaries(t *testing.T) {
	// Trees: a path and everything below it.
	cluster := []string{"k8s.io/client-go", "sigs.k8s.io/controller-runtime", "k8s.io/apiserver", "net/http/httptest"}
	server := []string{"github.com/open-policy-agent/cert-controller", "sigs.k8s.io/controller-runtime/pkg/manager", "sigs.k8s.io/controller-runtime/pkg/webhook"}
	tests := map[string]struct {
		packages, trees []string
	}{
		module + "/webhook/inject":             {[]string{module + "/webhook", module + "/webhook/gpunodes", module + "/webhook/admitinput"}, cluster},
		module + "/webhook/gpunodes":           {[]string{module + "/webhook", module + "/webhook/admitinput"}, nil},
		module + "/webhook/admitinput":         {[]string{module + "/webhook", module + "/webhook/gpunodes"}, server},
		module + "/webhook/admitinput/offline": {[]string{module + "/webhook"}, server},
		module + "/mutate":                     {[]string{module + "/webhook"}, server},
		module + "/podstatus":                  {[]string{module + "/webhook"}, server},
		module + "/precheck":                   {[]string{module + "/webhook"}, server},
	}
	for pkg, tc := range tests {
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			for _, dep := range deps(t, pkg) {
				if forbidden(dep, tc.packages, tc.trees) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		})
	}
}

func forbidden(dep string, packages, trees []string) bool {
	for _, p := range packages {
		if dep == p {
			return true
		}
	}
	for _, tr := range trees {
		if dep == tr || strings.HasPrefix(dep, tr+"/") {
			return true
		}
	}
	return false
}

// deps lists what pkg links, itself included, as `go list -deps` does.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goCmd, "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	list := strings.Fields(string(out))
	if len(list) == 0 {
		t.Fatalf("go list -deps %s listed nothing", pkg)
	}
	return list
}
