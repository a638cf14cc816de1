package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// TestReleaseUnsigned: without a key the release is built and says it is
// unsigned.
func TestReleaseUnsigned(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release")
	}
	cache, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cache, "helm-"+cluster.HelmVersion, "helm")); err != nil {
		t.Skipf("helm is not built (hack/tools.sh helm): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "--out", out, "--platforms", "", "--skip-image", "--skip-sbom", "1.0.0")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "COSIGN_KEY=")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}
	if !strings.Contains(string(b), "UNSIGNED") {
		t.Errorf("release.sh does not say the release is unsigned:\n%s", b)
	}
	if m, _ := filepath.Glob(filepath.Join(out, "*.sig")); len(m) != 0 {
		t.Errorf("signatures without a key: %v", m)
	}
}
