package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestContainerdNRIConfig: the built containerd reads the NRI runtime's config
// as meant (containerd's own `config dump`, after its migration to the
// current version): the 1.6 config's behaviour in the plugins 2.x split the
// CRI plugin into, the shim and runc of the build, and NRI
// on with its default validator. Skipped until hack/tools.sh containerd ran.
func TestContainerdNRIConfig(t *testing.T) {
	cache, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	containerd := filepath.Join(cache, "containerd-"+ContainerdVersion, "containerd")
	if !executable(containerd) {
		t.Skipf("%s is missing: run hack/tools.sh containerd", containerd)
	}
	dir := t.TempDir()
	b := Binaries{ContainerdShim: "/cache/containerd-shim-runc-v2", Runc: "/cache/runc"}
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte(containerdNRIConfig(filepath.Join(dir, "ctrd"), "/run/x/containerd.sock", "127.0.0.1:1338", "/x/net.d", b)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(containerd, "--config", conf, "config", "dump").Output()
	if err != nil {
		t.Fatalf("containerd config dump: %v", err)
	}
	dump := string(out)
	for _, want := range []string{
		"root = '" + filepath.Join(dir, "ctrd", "root") + "'",
		// io.containerd.cri.v1.images
		"sandbox = '" + PauseImage + "'",
		// io.containerd.cri.v1.runtime
		"restrict_oom_score_adj = true",
		"default_runtime_name = 'runc'",
		"runtime_path = '/cache/containerd-shim-runc-v2'",
		"BinaryName = '/cache/runc'",
		"SystemdCgroup = false",
		"bin_dirs = ['" + cniBinDir + "']",
		"conf_dir = '/x/net.d'",
		// io.containerd.grpc.v1.cri
		"stream_server_address = '127.0.0.1'",
		// io.containerd.server.v1.grpc, from [grpc] by the migration
		"address = '/run/x/containerd.sock'",
		// io.containerd.nri.v1.nri
		"socket_path = '" + nriSocketInNamespace + "'",
		"[plugins.'io.containerd.nri.v1.nri'.default_validator]\n      enable = true",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("containerd's view of the config lacks %q", want)
		}
	}
	if strings.Contains(dump, "[plugins.'io.containerd.nri.v1.nri']\n    disable = true") {
		t.Error("NRI is disabled")
	}
	if t.Failed() {
		t.Logf("config dump:\n%s", dump)
	}
}

// TestFindRuntimeBinaries: an unknown runtime is refused, and RuntimeNRI
// takes containerd, its shim, ctr and runc from the cache (saying how to build
// them), never from the host.
func TestFindRuntimeBinaries(t *testing.T) {
	if _, err := FindRuntimeBinaries(t.TempDir(), "podman"); err == nil || !strings.Contains(err.Error(), `unknown runtime "podman"`) {
		t.Errorf("runtime podman: %v", err)
	}
	cache := t.TempDir()
	b, err := FindRuntimeBinaries(cache, RuntimeNRI)
	if err == nil {
		t.Fatal("an empty cache: no error")
	}
	for _, want := range []string{"run hack/tools.sh containerd first", "run hack/tools.sh runc first"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	for name, p := range map[string]string{"containerd": b.Containerd, "shim": b.ContainerdShim, "ctr": b.Ctr, "runc": b.Runc} {
		if !strings.HasPrefix(p, cache+string(filepath.Separator)) {
			t.Errorf("%s = %q, want it under the cache %s", name, p, cache)
		}
	}
	if strings.Contains(err.Error(), "install-runtime.sh first") && (strings.Contains(err.Error(), "containerd is not installed") || strings.Contains(err.Error(), "runc is not installed")) {
		t.Errorf("RuntimeNRI asks for the host's containerd or runc: %v", err)
	}

	// RuntimeCRIO: crio, pinns and runc from the cache; no containerd at all.
	b, err = FindRuntimeBinaries(cache, RuntimeCRIO)
	if err == nil {
		t.Fatal("CRI-O, an empty cache: no error")
	}
	for _, want := range []string{"crio is missing: run hack/tools.sh crio first", "pinns is missing: run hack/tools.sh crio first", "run hack/tools.sh runc first"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CRI-O: error lacks %q: %v", want, err)
		}
	}
	for name, p := range map[string]string{"crio": b.CRIO, "pinns": b.Pinns, "runc": b.Runc} {
		if !strings.HasPrefix(p, cache+string(filepath.Separator)) {
			t.Errorf("CRI-O: %s = %q, want it under the cache %s", name, p, cache)
		}
	}
	if b.Containerd != "" || b.Ctr != "" || strings.Contains(err.Error(), "containerd") {
		t.Errorf("RuntimeCRIO asks for a containerd (%q, %q): %v", b.Containerd, b.Ctr, err)
	}
}

// TestCRIOConfig: the built crio reads the CRI-O runtime's config as meant
// (CRI-O's own `crio config`, which prints the configuration it would run
// with): cgroupfs, the cluster's runc, conmon and pinns, its folders, and NRI
// on. `crio config` (v1.36.3) never prints the default validator's table: it
// compares CRI-O's defaults with themselves to decide whether to. That the
// validator is on, TestNRIRuntime/crio shows by its refusal. Skipped until
// hack/tools.sh crio ran.
func TestCRIOConfig(t *testing.T) {
	cache, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := FindRuntimeBinaries(cache, RuntimeCRIO)
	if !executable(b.CRIO) {
		t.Skipf("%s is missing: run hack/tools.sh crio", b.CRIO)
	}
	if err != nil {
		t.Skipf("the CRI-O runtime is incomplete: %v", err)
	}
	dir := t.TempDir()
	f := newCRIOFiles(filepath.Join(dir, "crio"))
	if err := f.write("/run/x", "/run/x/crio.sock", "/x/net.d", []string{"127.0.0.1:5000", "10.88.7.1:5000"}, b); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(b.CRIO, "--config", f.config, "--config-dir", f.configDir, "config")
	cmd.Env = append(os.Environ(), f.env()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("crio config: %v\n%s", err, out)
	}
	dump := string(out)
	for _, want := range []string{
		// The storage.conf's, so crio prints it as a default (commented).
		"root = \"" + filepath.Join(f.dir, "storage") + "\"",
		"\nlisten = \"/run/x/crio.sock\"",
		"\ncgroup_manager = \"cgroupfs\"",
		"\ndefault_runtime = \"runc\"",
		"\npinns_path = \"" + b.Pinns + "\"",
		"runtime_path = \"" + b.Runc + "\"",
		"monitor_path = \"" + b.Conmon + "\"",
		"\nnetwork_dir = \"/x/net.d\"",
		"enable_nri = true",
		"nri_listen = \"" + nriSocketInNamespace + "\"",
		"\npause_image = \"" + PauseImage + "\"",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("crio's view of the config lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("crio config:\n%s", dump)
	}
}
