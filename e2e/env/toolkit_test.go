package env

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

// The toolkit reads its mode, runtime and spec folder from these keys
// (nvidia-container-toolkit api/config/v1 RuntimeConfig's toml tags): a
// misplaced key is ignored by it, and the runtime then runs in auto mode.
func TestToolkitConfig(t *testing.T) {
	var cfg struct {
		Runtime struct {
			Debug    string   `toml:"debug"`
			Mode     string   `toml:"mode"`
			Runtimes []string `toml:"runtimes"`
			Modes    struct {
				CDI struct {
					DefaultKind string   `toml:"default-kind"`
					SpecDirs    []string `toml:"spec-dirs"`
				} `toml:"cdi"`
			} `toml:"modes"`
		} `toml:"nvidia-container-runtime"`
	}
	if _, err := toml.Decode(toolkitConfig("/l/log", "/l/cdi", "/b/runc"), &cfg); err != nil {
		t.Fatal(err)
	}
	rt := cfg.Runtime
	if rt.Debug != "/l/log" || rt.Mode != "cdi" || !slices.Equal(rt.Runtimes, []string{"/b/runc"}) ||
		rt.Modes.CDI.DefaultKind != "nvidia.com/gpu" || !slices.Equal(rt.Modes.CDI.SpecDirs, []string{"/l/cdi"}) {
		t.Errorf("config %+v", rt)
	}
}

// Each GPU is named as NVIDIA's device plugin names it in
// NVIDIA_VISIBLE_DEVICES (its UUID) and by index; the driver's files are
// mounted read-only where the loader and PATH find them.
func TestToolkitCDISpec(t *testing.T) {
	e := &Env{Nodes: []*Node{{Name: "n", Kubelet: true, Layout: standin.GKE, DriverVersion: "535.104.05", GPUs: 2, HostRoot: "/"}}}
	b, err := e.toolkitCDISpec()
	if err != nil {
		t.Fatal(err)
	}
	var spec cdiSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range spec.Devices {
		names = append(names, d.Name)
	}
	if want := []string{standin.UUID(0), "0", standin.UUID(1), "1", "all"}; spec.Kind != "nvidia.com/gpu" || !slices.Equal(names, want) {
		t.Errorf("kind %s, devices %v, want nvidia.com/gpu %v", spec.Kind, names, want)
	}
	mounts := map[string]string{}
	for _, m := range spec.ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
		if !slices.Contains(m.Options, "ro") {
			t.Errorf("mount %s is not read-only: %v", m.ContainerPath, m.Options)
		}
	}
	for c, h := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1":      "/home/kubernetes/bin/nvidia/lib64/libcuda.so.535.104.05",
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": "/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.535.104.05",
		"/usr/bin/nvidia-smi":                         "/home/kubernetes/bin/nvidia/bin/nvidia-smi",
	} {
		if mounts[c] != h {
			t.Errorf("%s mounts %q, want %s", c, mounts[c], h)
		}
	}
}
