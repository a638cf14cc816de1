package nriplugin

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// folderPlan is a driver in its own folder, mounted whole.
func folderPlan(version string) layout.Plan {
	return layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: version,
		Mounts: []layout.Mount{
			{HostPath: "/usr/local/nvidia/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
			{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
		},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
}

type counts map[string]int

func newPlugin(t testing.TB, plan *layout.Plan) (*Plugin, counts) {
	t.Helper()
	dir := t.TempDir()
	if plan != nil {
		if err := statedir.WriteLayout(dir, plan, statedir.NoLayout{}); err != nil {
			t.Fatal(err)
		}
	}
	c := counts{}
	return &Plugin{StateDir: dir, Rules: config.Default().Rules(), Log: logr.Discard(), Count: func(r string) { c[r]++ }}, c
}

func pod(marker string) *api.PodSandbox {
	p := &api.PodSandbox{Id: "sandbox", Name: "train", Namespace: "ml", Annotations: map[string]string{"other": "x"}}
	if marker != "" {
		p.Annotations[layout.AnnotationRuntimeInject] = marker
	}
	return p
}

func gpuContainer(name string, devices ...string) *api.Container {
	if devices == nil {
		devices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"}
	}
	c := &api.Container{Id: "c-" + name, Name: name, Linux: &api.LinuxContainer{},
		Mounts: []*api.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/kubelet/pods/x/etc-hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: "/var/lib/kubelet/pods/x/volumes/sa", Options: []string{"rbind", "rprivate", "ro"}},
		}}
	for _, d := range devices {
		c.Linux.Devices = append(c.Linux.Devices, &api.LinuxDevice{Path: d, Type: "c", Major: 195})
	}
	return c
}

func wantMounts(p layout.Plan) []*api.Mount {
	var out []*api.Mount
	for _, m := range p.Mounts {
		out = append(out, &api.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: []string{"rbind", "rprivate", "ro", "nosuid", "nodev"}})
	}
	return out
}

func mountsOf(adj *api.ContainerAdjustment) []*api.Mount {
	if adj == nil {
		return nil
	}
	return adj.Mounts
}

func TestCreateContainer(t *testing.T) {
	loose := workload.LooseFilePlan("570.133.20")
	folder := folderPlan("580.159.04")
	toolkit := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "580.159.04", RuntimeInjection: layout.RuntimeToolkit}
	tooMany := strings.Repeat("a,", layout.MaxRuntimeMarkerBytes/2) + "main"
	for name, tc := range map[string]struct {
		plan   *layout.Plan
		pod    *api.PodSandbox
		ctr    *api.Container
		want   []*api.Mount
		result string
	}{
		"loose files":          {plan: &loose, pod: pod("main"), ctr: gpuContainer("main"), want: wantMounts(loose), result: ResultInjected},
		"driver folders":       {plan: &folder, pod: pod("sidecar,main"), ctr: gpuContainer("main"), want: wantMounts(folder), result: ResultInjected},
		"unmarked pod":         {plan: &loose, pod: pod(""), ctr: gpuContainer("main"), result: ResultUnmarked},
		"container not listed": {plan: &loose, pod: pod("main"), ctr: gpuContainer("sidecar"), result: ResultNotListed},
		// A forged marker on a CPU container: the kubelet gave it no GPU.
		"forged marker, no device": {plan: &loose, pod: pod("main"), ctr: gpuContainer("main", "/dev/fuse"), result: ResultNoGPU},
		// The control devices come with any driver; only /dev/nvidia<N> is a GPU.
		"control devices only":      {plan: &loose, pod: pod("main"), ctr: gpuContainer("main", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0x"), result: ResultNoGPU},
		"a GPU among other devices": {plan: &folder, pod: pod("main"), ctr: gpuContainer("main", "/dev/fuse", "/dev/nvidia7"), want: wantMounts(folder), result: ResultInjected},
		"odd container name":        {plan: &loose, pod: pod("Main_1"), ctr: gpuContainer("Main_1"), result: ResultBadMarker},
		"path as a name":            {plan: &loose, pod: pod("../../etc"), ctr: gpuContainer("main"), result: ResultBadMarker},
		"empty name in the list":    {plan: &loose, pod: pod("main,,x"), ctr: gpuContainer("main"), result: ResultBadMarker},
		"a name listed twice":       {plan: &loose, pod: pod("main,main"), ctr: gpuContainer("main"), result: ResultBadMarker},
		"a huge marker":             {plan: &loose, pod: pod(tooMany), ctr: gpuContainer("main"), result: ResultBadMarker},
		"toolkit node":              {plan: &toolkit, pod: pod("main"), ctr: gpuContainer("main"), result: ResultRuntimeInjects},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, tc.plan)
			adj, upd, err := p.CreateContainer(context.Background(), tc.pod, tc.ctr)
			if err != nil || upd != nil {
				t.Fatalf("CreateContainer = %v, %v, want no error and no update", upd, err)
			}
			if got := mountsOf(adj); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("mounts\n%v\nwant\n%v", got, tc.want)
			}
			if adj != nil && (len(adj.Env) > 0 || adj.Linux != nil || len(adj.Annotations) > 0) {
				t.Errorf("the adjustment changes more than mounts: %v", adj)
			}
			if !reflect.DeepEqual(c, counts{tc.result: 1}) {
				t.Errorf("counted %v, want %s once", c, tc.result)
			}
		})
	}
}

func TestCreateContainerTargetMounted(t *testing.T) {
	loose, folder := workload.LooseFilePlan("570.133.20"), folderPlan("580.159.04")
	for name, tc := range map[string]struct {
		plan layout.Plan
		dst  string
	}{
		"same file":                         {loose, "/usr/local/nvidia/lib64/libcuda.so.1"},
		"a hand-written driver folder":      {loose, "/usr/local/nvidia"},
		"the library folder":                {loose, "/usr/local/nvidia/lib64"},
		"same folder":                       {folder, "/usr/local/nvidia/bin"},
		"a file inside a folder we mount":   {folder, "/usr/local/nvidia/lib64/libcuda.so.1"},
		"a folder inside a folder we mount": {folder, "/usr/local/nvidia/lib64/extra/"},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, &tc.plan)
			ctr := gpuContainer("main")
			ctr.Mounts = append(ctr.Mounts, &api.Mount{Destination: tc.dst, Type: "bind", Source: "/usr/lib/nvidia-384", Options: []string{"rbind", "ro"}})
			adj, _, err := p.CreateContainer(context.Background(), pod("main"), ctr)
			if err != nil || adj != nil {
				t.Fatalf("CreateContainer = %v, %v, want nothing", adj, err)
			}
			if c[ResultTargetMounted] != 1 {
				t.Errorf("counted %v", c)
			}
		})
	}
	// A mount beside ours, not over it, does not stop the injection.
	p, _ := newPlugin(t, &folder)
	ctr := gpuContainer("main")
	ctr.Mounts = append(ctr.Mounts, &api.Mount{Destination: "/usr/local/nvidia-tools", Type: "bind", Source: "/srv/tools"})
	if adj, _, err := p.CreateContainer(context.Background(), pod("main"), ctr); err != nil || len(mountsOf(adj)) != 2 {
		t.Errorf("a neighbouring mount: %v, %v", adj, err)
	}
}

func TestCreateContainerNoLayout(t *testing.T) {
	outside := folderPlan("580.159.04")
	outside.Mounts[0].HostPath = "/etc"
	kernel := workload.LooseFilePlan("570.133.20")
	kernel.Mounts[0].HostPath = "/usr/local/nvidia/proc/1/root"
	for name, tc := range map[string]struct {
		write func(dir string) error
		want  string
	}{
		"no file yet": {func(string) error { return nil }, "the probe has published no layout yet"},
		"driver being upgraded": {func(dir string) error {
			return statedir.WriteLayout(dir, nil, statedir.NoLayout{State: layout.StateError, Reason: "DriverVersionMismatch: the running driver's files are not on disk"})
		}, "state error: DriverVersionMismatch"},
		"wedged": {func(dir string) error {
			return statedir.WriteLayout(dir, nil, statedir.NoLayout{State: layout.StateWedged, Reason: "GPULost"})
		}, "state wedged: GPULost"},
		"outside the allowlist":        {func(dir string) error { return statedir.WriteLayout(dir, &outside, statedir.NoLayout{}) }, `"/etc" is not under the host path allowlist`},
		"the host's root through proc": {func(dir string) error { return statedir.WriteLayout(dir, &kernel, statedir.NoLayout{}) }, "a view of the host's processes"},
		"not JSON":                     {func(dir string) error { return statedir.WriteFile(dir, statedir.LayoutFile, []byte("{")) }, "failed to decode layout.json"},
		"unknown field": {func(dir string) error {
			return statedir.WriteFile(dir, statedir.LayoutFile, []byte(`{"schemaVersion":"v1","driverVersion":"1","mounts":[],"libraryPaths":[],"command":"x"}`))
		}, "unknown field"},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, nil)
			if err := tc.write(p.StateDir); err != nil {
				t.Fatal(err)
			}
			adj, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main"))
			if adj != nil || !errors.Is(err, ErrNoLayout) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CreateContainer = %v, %v; want ErrNoLayout saying %q", adj, err, tc.want)
			}
			if !strings.Contains(err.Error(), `container "main" of pod ml/train`) {
				t.Errorf("the error does not name the container: %v", err)
			}
			if c[ResultNoLayout] != 1 {
				t.Errorf("counted %v", c)
			}
			// Only a marked GPU container is refused.
			if _, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main", "/dev/fuse")); err != nil {
				t.Errorf("a container without a GPU was refused: %v", err)
			}
		})
	}
}

// TestCreateContainerDriverUpgrade replaces layout.json as the probe does
// after an upgrade: the next container gets the new driver's mounts.
func TestCreateContainerDriverUpgrade(t *testing.T) {
	old, next := workload.LooseFilePlan("570.133.20"), workload.LooseFilePlan("580.95.05")
	p, _ := newPlugin(t, &old)
	create := func() []*api.Mount {
		t.Helper()
		adj, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main"))
		if err != nil {
			t.Fatal(err)
		}
		return mountsOf(adj)
	}
	if got := create(); !reflect.DeepEqual(got, wantMounts(old)) {
		t.Fatalf("before the upgrade: %v", got)
	}
	// Between the two, the probe says the driver is changing.
	if err := statedir.WriteLayout(p.StateDir, nil, statedir.NoLayout{State: layout.StateError, Reason: "the NVML library changed"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main")); !errors.Is(err, ErrNoLayout) {
		t.Fatalf("during the upgrade: %v, want ErrNoLayout", err)
	}
	if err := statedir.WriteLayout(p.StateDir, &next, statedir.NoLayout{}); err != nil {
		t.Fatal(err)
	}
	if got := create(); !reflect.DeepEqual(got, wantMounts(next)) {
		t.Fatalf("after the upgrade: %v", got)
	}
	// An adjustment handed out is the caller's: changing it leaves the plan alone.
	got := create()
	got[0].Source = "/etc"
	if again := create(); again[0].Source == "/etc" {
		t.Error("a returned mount shares its value with the cached plan")
	}
}

func TestIsGPUDevicePath(t *testing.T) {
	for p, want := range map[string]bool{
		"/dev/nvidia0": true, "/dev/nvidia15": true, "/dev/nvidia": false, "/dev/nvidiactl": false,
		"/dev/nvidia-uvm": false, "/dev/nvidia0/x": false, "/host/dev/nvidia0": false, "": false,
		"/dev/dri/card0": false, "/dev/nvidia-caps/nvidia-cap1": false,
	} {
		if got := isGPUDevicePath(p); got != want {
			t.Errorf("isGPUDevicePath(%q) = %v", p, got)
		}
	}
}

// BenchmarkCreateContainer measures what the plugin adds to every container
// creation on a node: the unmarked fast path, and a marked GPU container
// given a 19-file plan (the stat of layout.json included).
func BenchmarkCreateContainer(b *testing.B) {
	plan := workload.LooseFilePlan("570.133.20")
	for name, tc := range map[string]struct {
		pod *api.PodSandbox
		ctr *api.Container
	}{
		"unmarked":      {pod(""), gpuContainer("main")},
		"injected":      {pod("main"), gpuContainer("main")},
		"not-listed":    {pod("sidecar"), gpuContainer("main")},
		"marker-no-gpu": {pod("main"), gpuContainer("main", "/dev/fuse")},
	} {
		b.Run(name, func(b *testing.B) {
			p, _ := newPlugin(b, &plan)
			p.Count = nil
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := p.CreateContainer(context.Background(), tc.pod, tc.ctr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
