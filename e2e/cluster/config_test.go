package cluster

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestVersions: the Go launcher and hack/versions.sh read versions.env alike,
// the environment wins in both, and both refuse a version written without
// its v (as a user may type KUBERNETES_VERSION=1.33.13), naming the variable.
func TestVersions(t *testing.T) {
	names := []string{"ETCD_VERSION", "KUBERNETES_VERSION", "HELM_VERSION", "NVIDIA_DEVICE_PLUGIN_VERSION", "CONTAINERD_VERSION", "RUNC_VERSION"}
	// The environment without the versions, as on a fresh shell.
	base := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k) || k == "GPU_INJECTOR_CACHE"
	})
	script := func(t *testing.T, env ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("bash", "-c", `source hack/versions.sh && echo "$ETCD_VERSION $KUBERNETES_VERSION $HELM_VERSION $NVIDIA_DEVICE_PLUGIN_VERSION $CONTAINERD_VERSION $RUNC_VERSION"`)
		cmd.Dir = "../.."
		cmd.Env = append(slices.Clone(base), env...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	goVersions := func(t *testing.T, env ...string) string {
		t.Helper()
		for _, n := range names {
			t.Setenv(n, "")
		}
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
		var got []string
		for _, n := range names {
			got = append(got, version(n))
		}
		return strings.Join(got, " ")
	}

	t.Run("from versions.env", func(t *testing.T) {
		sh, err := script(t)
		if err != nil {
			t.Fatalf("hack/versions.sh: %v: %s", err, sh)
		}
		if g := goVersions(t); sh != g {
			t.Errorf("hack/versions.sh reads %q, the launcher %q", sh, g)
		}
		if !strings.Contains(versionsFile, "\nKUBERNETES_VERSION="+strings.Fields(sh)[1]+"\n") {
			t.Errorf("neither reads versions.env's Kubernetes: %q", sh)
		}
	})
	t.Run("the environment wins", func(t *testing.T) {
		sh, err := script(t, "KUBERNETES_VERSION=v1.33.13")
		if err != nil {
			t.Fatalf("hack/versions.sh: %v: %s", err, sh)
		}
		if g := goVersions(t, "KUBERNETES_VERSION=v1.33.13"); sh != g || strings.Fields(sh)[1] != "v1.33.13" {
			t.Errorf("with KUBERNETES_VERSION=v1.33.13: hack/versions.sh reads %q, the launcher %q", sh, g)
		}
	})
	t.Run("a version without its v is refused", func(t *testing.T) {
		sh, err := script(t, "KUBERNETES_VERSION=1.33.13")
		if err == nil || !strings.Contains(sh, "KUBERNETES_VERSION=1.33.13 is not a release such as v1.37.2") {
			t.Errorf("hack/versions.sh with KUBERNETES_VERSION=1.33.13: %v: %q", err, sh)
		}
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), `KUBERNETES_VERSION="1.33.13"`) {
					t.Errorf("the launcher with KUBERNETES_VERSION=1.33.13: %v", r)
				}
			}()
			goVersions(t, "KUBERNETES_VERSION=1.33.13")
		}()
	})
}
