package nodeprobe

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
)

// expected outcome of each fake root, with NVML reporting the layout's
// version and without NVML at all. The golden files hold the exact plans.
var expected = map[string]struct {
	withNVML, withoutNVML Condition
	source                VersionSource // without NVML
	libDirMount           string        // the Directory mount at the library folder, or "" for file by file
	binDirMount           string
	runtime               string // the plan's runtimeInjection
}{
	"ubuntu1604-nvidia384": {ConditionReady, ConditionReady, SourceFileNames, "", "/usr/lib/nvidia-384/bin", ""},
	"centos7":              {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"gke-cos":              {ConditionReady, ConditionReady, SourceFileNames, "/home/kubernetes/bin/nvidia/lib64", "/home/kubernetes/bin/nvidia/bin", ""},
	"ubuntu2204-packages":  {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"usr-local-nvidia":     {ConditionReady, ConditionReady, SourceFileNames, "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", ""},
	"hostile-escape":       {ConditionReady, ConditionReady, SourceFileNames, "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin", ""},
	"hostile-two-versions": {ConditionReady, ConditionReady, SourceLoaderCache, "/usr/lib/nvidia-390", "/usr/lib/nvidia-390/bin", ""},
	"hostile-unversioned":  {ConditionReady, ConditionReady, SourceLoaderCache, "", "", ""},
	"gpu-operator":         {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"hostile-stubs-only":   {ConditionDriverFilesNotFound, ConditionDriverFilesNotFound, "", "", "", ""},
	"no-driver":            {ConditionNoDriver, ConditionNoDriver, "", "", "", ""},

	"ubuntu2404-nvidia-driver-570":        {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"ubuntu2204-nvidia-driver-535-server": {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"debian12-nvidia-driver":              {ConditionReady, ConditionReady, SourceFileNames, "/usr/lib/x86_64-linux-gnu/nvidia/current", "", ""},
	"rhel9-nvidia-repo":                   {ConditionReady, ConditionReady, SourceLoaderCache, "", "", ""},
	"sles15-nvidia-compute-g06":           {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"flatcar-nvidia":                      {ConditionReady, ConditionReady, SourceFileNames, "/opt/nvidia/570.181/lib64", "/opt/nvidia/570.181/bin", ""},
	"nixos":                               {ConditionReady, ConditionReady, SourceFileNames, "/nix/store/1b7l2m3k4j5h6g7f8d9s0a1q2w3e4r5t-nvidia-x11-565.77-6.6.63/lib", "/nix/store/6y7u8i9o0p1a2s3d4f5g6h7j8k9l0z1x-nvidia-x11-565.77-6.6.63-bin/bin", ""},
	"ubuntu2404-arm64-gh200":              {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"run-installer":                       {ConditionReady, ConditionReady, SourceFileNames, "", "", ""},
	"amazonlinux2-eks-gpu":                {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"amazonlinux2023-eks-nvidia":          {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"bottlerocket-nvidia":                 {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"gpu-operator-toolkit":                {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"crio-toolkit":                        {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"gpu-operator-openshift":              {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"docker-cri-dockerd":                  {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeToolkit},
	"talos-nvidia-extension":              {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeCDI},
	"gke-cos-device-plugin":               {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeDevicePlugin},
	"ubuntu-cdi":                          {ConditionReady, ConditionReady, SourceFileNames, "", "", layout.RuntimeCDI},
}

// noNVML makes the probe find no usable library, as on a node without one.
func noNVML(string) (NVML, error) {
	return nil, &nvmlUnusable{NVMLResult{State: NVMLLibraryNotFound, Message: "test: no library"}}
}

func buildRoot(t testing.TB, name string) (string, fakeroot.Layout) {
	t.Helper()
	root := t.TempDir()
	l, err := fakeroot.Build(root, name)
	if err != nil {
		t.Fatal(err)
	}
	return root, l
}

func probeRoot(t testing.TB, root string, open func(string) (NVML, error)) Result {
	t.Helper()
	res, err := Probe(ProbeOptions{HostRoot: root, OpenNVML: open})
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	// The library path is on this machine: make it a host path for the golden file.
	if rel, ok := strings.CutPrefix(res.NVMLLibrary, root); ok {
		res.NVMLLibrary = rel
	}
	return res
}

func TestProbeFakeRoots(t *testing.T) {
	if len(expected) != len(fakeroot.Names()) {
		t.Fatalf("expected lists %d layouts, fakeroot has %v", len(expected), fakeroot.Names())
	}
	for name, want := range expected {
		t.Run(name, func(t *testing.T) {
			root, l := buildRoot(t, name)
			withNVML := probeRoot(t, root, openWith(fakeNVML(l.DriverVersion, 13000, h100, h100)))
			without := probeRoot(t, root, noNVML)
			if withNVML.Condition != want.withNVML {
				t.Errorf("with NVML: condition %s (%s), want %s", withNVML.Condition, withNVML.Message, want.withNVML)
			}
			if without.Condition != want.withoutNVML || without.VersionSource != want.source {
				t.Errorf("without NVML: condition %s from %q (%s), want %s from %q", without.Condition, without.VersionSource, without.Message, want.withoutNVML, want.source)
			}
			for label, res := range map[string]Result{"with NVML": withNVML, "without NVML": without} {
				if !res.Ready() {
					continue
				}
				if res.Plan.RuntimeInjection != want.runtime {
					t.Errorf("%s: runtimeInjection %q, want %q", label, res.Plan.RuntimeInjection, want.runtime)
				}
				if want.runtime != "" {
					if len(res.Plan.Mounts) != 0 || res.Plan.DriverVersion != l.DriverVersion {
						t.Errorf("%s: a runtime-injected plan with mounts or the wrong version: %+v", label, res.Plan)
					}
					// GKE's device plugin mounts the driver but sets no
					// LD_LIBRARY_PATH; the toolkit runs ldconfig.
					var wantLibs []string
					if want.runtime == layout.RuntimeDevicePlugin {
						wantLibs = []string{"/usr/local/nvidia/lib64"}
					}
					if !slices.Equal(res.Plan.LibraryPaths, wantLibs) {
						t.Errorf("%s: library paths %q, want %q", label, res.Plan.LibraryPaths, wantLibs)
					}
					continue
				}
				checkPlan(t, label, root, l, *res.Plan, want.libDirMount, want.binDirMount)
			}
			if withNVML.Ready() && without.Ready() && !reflect.DeepEqual(withNVML.Plan.Mounts, without.Plan.Mounts) {
				t.Errorf("the plan depends on NVML: %+v vs %+v", withNVML.Plan.Mounts, without.Plan.Mounts)
			}
			golden(t, filepath.Join("testdata", "fakeroots", name+".json"), map[string]Result{"withNVML": withNVML, "withoutNVML": without})
		})
	}
}

// checkPlan asserts what every plan must be: valid under the default rules,
// made of files that exist, driver files only in shared folders, and the
// expected whole-folder mounts.
func checkPlan(t *testing.T, label, root string, l fakeroot.Layout, p layout.Plan, libDir, binDir string) {
	t.Helper()
	if errs := p.Validate(config.Default().Rules()); len(errs) > 0 {
		t.Errorf("%s: plan invalid: %v", label, errs)
	}
	if p.DriverVersion != l.DriverVersion {
		t.Errorf("%s: driver version %s, want %s", label, p.DriverVersion, l.DriverVersion)
	}
	dirs := map[string]string{}
	for _, m := range p.Mounts {
		fi, err := os.Lstat(filepath.Join(root, m.HostPath))
		if err != nil {
			t.Errorf("%s: mount %s: %v", label, m.HostPath, err)
			continue
		}
		switch m.Kind {
		case layout.KindDirectory:
			dirs[m.ContainerPath] = m.HostPath
			if !fi.IsDir() {
				t.Errorf("%s: Directory mount %s is not a folder", label, m.HostPath)
			}
		case layout.KindFile:
			if !fi.Mode().IsRegular() {
				t.Errorf("%s: File mount %s is not a regular file (links must be resolved)", label, m.HostPath)
			}
			name := path.Base(m.HostPath)
			if _, v, ok := parseLibraryName(name); ok {
				if v != l.DriverVersion {
					t.Errorf("%s: %s is not of version %s", label, m.HostPath, l.DriverVersion)
				}
			} else if !contains(DriverBinaries, name) {
				t.Errorf("%s: %s is not a driver file", label, m.HostPath)
			}
		}
	}
	if dirs["/usr/local/nvidia/lib64"] != libDir || dirs["/usr/local/nvidia/bin"] != binDir {
		t.Errorf("%s: whole-folder mounts %v, want lib %q bin %q", label, dirs, libDir, binDir)
	}
	if !reflect.DeepEqual(p.LibraryPaths, []string{"/usr/local/nvidia/lib64"}) {
		t.Errorf("%s: library paths %v", label, p.LibraryPaths)
	}
	// Every library the loader asks for must be in the container.
	want := []string{"libcuda.so.1", "libnvidia-ml.so.1"}
	for _, so := range want {
		found := false
		for _, m := range p.Mounts {
			if m.ContainerPath == "/usr/local/nvidia/lib64/"+so {
				found = true
			}
			if m.Kind == layout.KindDirectory && m.ContainerPath == "/usr/local/nvidia/lib64" {
				if _, err := os.Stat(filepath.Join(root, m.HostPath, so)); err == nil {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s: %s is not in the container", label, so)
		}
	}
}

// golden compares v with a file; REFRESH_GOLDEN=true rewrites it.
func golden(t *testing.T, file string, v any) {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("REFRESH_GOLDEN") == "true" {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run with REFRESH_GOLDEN=true to create it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("%s differs (REFRESH_GOLDEN=true rewrites it); got:\n%s", file, b.String())
	}
}

func TestGoldenFilesHaveLayouts(t *testing.T) {
	files, err := filepath.Glob("testdata/fakeroots/*.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := expected[strings.TrimSuffix(filepath.Base(f), ".json")]; !ok {
			t.Errorf("golden file %s has no layout", f)
		}
	}
}

// TestProbeRealLdconfigCache replaces the written cache with one that glibc's
// ldconfig builds over the same root: the plans must not change.
func TestProbeRealLdconfigCache(t *testing.T) {
	if _, err := exec.LookPath("ldconfig"); err != nil {
		t.Skipf("needs ldconfig: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("ldconfig -r chroots, which needs root")
	}
	for _, name := range fakeroot.Names() {
		t.Run(name, func(t *testing.T) {
			root, l := buildRoot(t, name)
			if l.CacheDir != "" {
				t.Skipf("the layout has no /etc/ld.so.cache (its loader cache is %s)", l.CacheDir)
			}
			before := probeRoot(t, root, noNVML)
			if out, err := exec.Command("ldconfig", "-X", "-r", root).CombinedOutput(); err != nil {
				t.Fatalf("ldconfig: %v: %s", err, out)
			}
			after := probeRoot(t, root, noNVML)
			// ldconfig also indexes the development links (libcuda.so), so
			// the evidence lists more entries; what they lead to is the same.
			before.Evidence, after.Evidence = nil, nil
			if !reflect.DeepEqual(before, after) {
				t.Errorf("plan changed with ldconfig's cache:\nwritten: %+v\nldconfig: %+v", before, after)
			}
		})
	}
}

func TestProbeConditions(t *testing.T) {
	initFails := func(ret nvml.Return) func(string) (NVML, error) {
		m := fakeNVML("", 0)
		m.InitFunc = func() nvml.Return { return ret }
		return openWith(m)
	}
	writeFile := func(p, data string) func(root string) {
		return func(root string) {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, tc := range map[string]struct {
		layout  string
		open    func(string) (NVML, error)
		prepare func(root string)
		want    Condition
		source  VersionSource
		version string
		message string
	}{
		"nvml version not on disk": {layout: "usr-local-nvidia", open: openWith(fakeNVML("590.10.01", 13010, h100)),
			want: ConditionDriverVersionMismatch, source: SourceNVML, version: "590.10.01", message: "NVML reports driver 590.10.01 but the files under the host root are of 580.159.04"},
		"nvml picks the older of two": {layout: "hostile-two-versions", open: openWith(fakeNVML(fakeroot.Version384, 9000, h100)),
			want: ConditionReady, source: SourceNVML, version: fakeroot.Version384},
		"upgrade without reboot": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_LIB_RM_VERSION_MISMATCH),
			want: ConditionDriverLibraryVersionMismatch, message: "ERROR_LIB_RM_VERSION_MISMATCH"},
		"no devices": {layout: "usr-local-nvidia", open: openWith(fakeNVML(fakeroot.Version580, 13000)),
			want: ConditionNoDevices, source: SourceNVML, version: fakeroot.Version580},
		"driver not loaded": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_DRIVER_NOT_LOADED),
			want: ConditionDriverNotLoaded},
		"driver loaded but no device nodes": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_DRIVER_NOT_LOADED),
			prepare: writeFile("/sys/module/nvidia/version", fakeroot.Version580+"\n"),
			want:    ConditionReady, source: SourceKernelModule, version: fakeroot.Version580},
		"no permission falls back to the kernel module": {layout: "hostile-two-versions", open: initFails(nvml.ERROR_NO_PERMISSION),
			prepare: writeFile("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.130  Tue Mar 21 2018\nGCC version:  gcc version 5.4.0\n"),
			want:    ConditionReady, source: SourceKernelModule, version: fakeroot.Version384},
		"kernel module newer than files": {layout: "usr-local-nvidia", open: noNVML,
			prepare: writeFile("/sys/module/nvidia/version", "590.10.01\n"),
			want:    ConditionDriverVersionMismatch, source: SourceKernelModule, version: "590.10.01"},
		"other nvml error": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_UNKNOWN),
			want: ConditionNVMLError, message: "ERROR_UNKNOWN"},
		"gpu lost": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_GPU_IS_LOST),
			want: ConditionGPULost, message: "NVML reports a GPU lost: nvmlInit failed: ERROR_GPU_IS_LOST"},
		"gpu needs a reset": {layout: "usr-local-nvidia", open: initFails(nvml.ERROR_RESET_REQUIRED),
			want: ConditionGPULost, message: "ERROR_RESET_REQUIRED"},
		"two versions and no cache": {layout: "hostile-two-versions", open: noNVML,
			prepare: func(root string) { _ = os.Remove(filepath.Join(root, "etc/ld.so.cache")) },
			want:    ConditionDriverVersionAmbiguous, message: "384.130, 390.48"},
		"corrupt cache is a note": {layout: "usr-local-nvidia", open: noNVML,
			prepare: writeFile("/etc/ld.so.cache", "glibc-ld.so.cache1.1 garbage"),
			want:    ConditionReady, source: SourceFileNames, version: fakeroot.Version580},
		"cache links out of the root": {layout: "hostile-two-versions", open: noNVML,
			prepare: func(root string) {
				p := filepath.Join(root, "etc/ld.so.cache")
				_ = os.Remove(p)
				if err := os.Symlink("../../../../../../../../etc/ld.so.cache", p); err != nil {
					t.Fatal(err)
				}
			},
			want: ConditionDriverVersionAmbiguous},
		"a required library is missing": {layout: "usr-local-nvidia", open: openWith(fakeNVML(fakeroot.Version580, 13000, h100)),
			prepare: func(root string) {
				for _, p := range []string{"usr/local/nvidia/lib64/libcuda.so." + fakeroot.Version580, "usr/lib/libcuda.so." + fakeroot.Version580} {
					if err := os.Remove(filepath.Join(root, p)); err != nil {
						t.Fatal(err)
					}
				}
			},
			want: ConditionRequiredLibraryMissing, source: SourceNVML, version: fakeroot.Version580, message: "libcuda.so.580.159.04 not found"},
		"host root missing": {layout: "no-driver", open: noNVML,
			prepare: func(root string) { _ = os.RemoveAll(root) },
			want:    ConditionHostRootUnreadable},
	} {
		t.Run(name, func(t *testing.T) {
			root, _ := buildRoot(t, tc.layout)
			if tc.prepare != nil {
				tc.prepare(root)
			}
			res := probeRoot(t, root, tc.open)
			if res.Condition != tc.want || res.VersionSource != tc.source || res.DriverVersion != tc.version {
				t.Errorf("got %s from %q version %q (%s), want %s from %q version %q", res.Condition, res.VersionSource, res.DriverVersion, res.Message, tc.want, tc.source, tc.version)
			}
			if !strings.Contains(res.Message, tc.message) {
				t.Errorf("message %q does not contain %q", res.Message, tc.message)
			}
			if res.Ready() {
				if errs := res.Plan.Validate(config.Default().Rules()); len(errs) > 0 {
					t.Errorf("plan invalid: %v", errs)
				}
			} else if res.Plan != nil {
				t.Errorf("a %s result carries a plan", res.Condition)
			}
		})
	}
}

// TestProbeWedgedDriver: an NVML that does not return within the limit is a
// wedged driver, even where the files alone would give a layout; the probe
// ends at the limit instead of waiting for NVML.
func TestProbeWedgedDriver(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	lib, _, _ := blockingNVML(t, "nvmlDeviceGetCount")
	start := time.Now()
	res, err := Probe(ProbeOptions{HostRoot: root, OpenNVML: openWith(lib), NVMLWatch: &NVMLWatch{Timeout: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the probe took %s with a 100ms NVML limit", took)
	}
	if res.Condition != ConditionDriverWedged || !res.Wedged() || res.Plan != nil || res.NVML.State != NVMLTimeout {
		t.Fatalf("got %s (%s), NVML %s, plan %v; want %s without a plan", res.Condition, res.Message, res.NVML.State, res.Plan, ConditionDriverWedged)
	}
	if want := "NVML does not answer: nvmlDeviceGetCount has not returned within 100ms (called at "; !strings.HasPrefix(res.Message, want) {
		t.Errorf("message %q, want it to start with %q", res.Message, want)
	}
}

// TestProbeFakeLibraryIsNotCalled loads the fake root's libnvidia-ml (a real
// ELF file without NVML's functions) through the default path: the probe
// must notice and fall back instead of dying in the loader.
func TestProbeFakeLibraryIsNotCalled(t *testing.T) {
	root, _ := buildRoot(t, "usr-local-nvidia")
	res, err := Probe(ProbeOptions{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if res.NVML.State != NVMLLibraryInvalid && res.NVML.State != NVMLLibraryNotFound {
		t.Fatalf("NVML state %s (%s), want LibraryInvalid or LibraryNotFound", res.NVML.State, res.NVML.Message)
	}
	if !res.Ready() || res.VersionSource != SourceFileNames {
		t.Errorf("got %s from %s, want a plan from the file names", res.Condition, res.VersionSource)
	}
}

func BenchmarkProbe(b *testing.B) {
	for _, name := range []string{"usr-local-nvidia", "ubuntu2204-packages"} {
		b.Run(name, func(b *testing.B) {
			root, l := buildRoot(b, name)
			open := openWith(fakeNVML(l.DriverVersion, 13000, h100))
			for b.Loop() {
				res, err := Probe(ProbeOptions{HostRoot: root, OpenNVML: open})
				if err != nil || !res.Ready() {
					b.Fatalf("probe: %v %s", err, res.Reason())
				}
			}
		})
	}
}

// TestProbeFindsBinFolderBelowAPattern: the classic nvidia-384 package keeps
// nvidia-smi only in /usr/lib/nvidia-384/bin (the /usr/bin link comes from
// update-alternatives and may be absent); a pattern in a middle element of a
// known folder (/usr/lib/nvidia-*/bin) must still find it.
func TestProbeFindsBinFolderBelowAPattern(t *testing.T) {
	root, l := buildRoot(t, "ubuntu1604-nvidia384")
	if err := os.Remove(filepath.Join(root, "usr/bin/nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	res := probeRoot(t, root, openWith(fakeNVML(l.DriverVersion, 13000, h100, h100)))
	if !res.Ready() {
		t.Fatalf("condition %s: %s", res.Condition, res.Message)
	}
	for _, m := range res.Plan.Mounts {
		if m.HostPath == "/usr/lib/nvidia-384/bin" && m.ContainerPath == "/usr/local/nvidia/bin" && m.Kind == layout.KindDirectory {
			return
		}
	}
	t.Errorf("no mount of /usr/lib/nvidia-384/bin at /usr/local/nvidia/bin: %+v", res.Plan.Mounts)
}
