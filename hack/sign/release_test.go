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

// TestReleaseWrongPassword: a key that does not open stops the release
// before anything is built or written.
func TestReleaseWrongPassword(t *testing.T) {
	if testing.Short() {
		t.Skip("runs hack/release.sh")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "cosign.key")
	if err := os.WriteFile(keyFile, cosignKey(t).priv, 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "release")
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "--out", out, "--key", keyFile, "--skip-image", "--skip-sbom", "1.0.0")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=not-"+testPassword)
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "cannot read the signing key") {
		t.Fatalf("release.sh with a wrong password: %v\n%s", err, b)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("it wrote %d files", len(entries))
	}
}
