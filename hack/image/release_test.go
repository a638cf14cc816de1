package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// TestReleaseChart runs hack/release.sh for the chart alone (no command-line
// archives, unsigned: hack/sign's TestRelease builds those) and checks that
// the packaged chart's version, appVersion and the image every template
// renders by default agree with the release's version, and that SHA256SUMS
// lists it.
func TestReleaseChart(t *testing.T) {
	cache, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(cache, "helm-"+cluster.HelmVersion, "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("helm is not built (hack/tools.sh helm): %v", err)
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "--out", out, "--skip-image", "--skip-sbom", "--platforms", "", "v9.8.7-rc.1")
	cmd.Env = append(os.Environ(), "IMAGE_REPOSITORY=registry.example.com/mirror/gpu-injector", "COSIGN_KEY=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}
	chart := filepath.Join(out, "gpu-injector-9.8.7-rc.1.tgz")
	shown, err := exec.Command(helm, "show", "chart", chart).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"version: 9.8.7-rc.1", "appVersion: 9.8.7-rc.1"} {
		if !regexp.MustCompile("(?m)^" + regexp.QuoteMeta(want) + "$").Match(shown) {
			t.Errorf("Chart.yaml lacks %q:\n%s", want, shown)
		}
	}
	rendered, err := exec.Command(helm, "template", "gpu-injector", chart, "--namespace", "gpu-injector",
		"--kube-version", strings.TrimPrefix(cluster.KubernetesVersion, "v")).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, rendered)
	}
	images := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*image:\s*"?([^"\s]+)"?\s*$`).FindAllSubmatch(rendered, -1) {
		images[string(m[1])] = true
	}
	var got []string
	for i := range images {
		got = append(got, i)
	}
	sort.Strings(got)
	if len(got) != 1 || got[0] != "registry.example.com/mirror/gpu-injector:9.8.7-rc.1" {
		t.Errorf("the chart renders images %v, want registry.example.com/mirror/gpu-injector:9.8.7-rc.1 only", got)
	}
	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil || !strings.Contains(string(sums), "  gpu-injector-9.8.7-rc.1.tgz\n") {
		t.Errorf("SHA256SUMS: %v\n%s", err, sums)
	}
}
