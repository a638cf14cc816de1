package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
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
	return &Plugin{StateDir: dir, Rules: config.Default().Rules(), Log: logr.Discard(), Count: func(r string) { c[r]++ },
		RecursiveReadOnly: true}, c
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
		out = append(out, &api.Mount{Source: m.HostPath, Destination: m.ContainerPath, Type: "bind", Options: []string{"rbind", "rprivate", "ro", "rro", "nosuid", "nodev"}})
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
			var wantEnv []*api.KeyValue
			if tc.want != nil {
				wantEnv = []*api.KeyValue{{Key: "LD_LIBRARY_PATH", Value: "/usr/local/nvidia/lib64"}}
			}
			if adj != nil && (!reflect.DeepEqual(adj.Env, wantEnv) || adj.Linux != nil || len(adj.Annotations) > 0) {
				t.Errorf("the adjustment changes more than mounts and LD_LIBRARY_PATH: %v", adj)
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

// TestCreateContainerDevices: only a character device of NVIDIA's major at
// /dev/nvidia<N> is a GPU; a raw block volume a pod's author put at that
// path, or another character device, gets nothing.
func TestCreateContainerDevices(t *testing.T) {
	folder := folderPlan("580.159.04")
	dev := func(path, typ string, major int64) *api.LinuxDevice {
		return &api.LinuxDevice{Path: path, Type: typ, Major: major}
	}
	for name, tc := range map[string]struct {
		devices []*api.LinuxDevice
		result  string
	}{
		"a GPU":                           {[]*api.LinuxDevice{dev("/dev/nvidiactl", "c", 195), dev("/dev/nvidia0", "c", 195)}, ResultInjected},
		"a raw block volume":              {[]*api.LinuxDevice{dev("/dev/nvidia0", "b", 7)}, ResultNotGPUDevice},
		"a block device of major 195":     {[]*api.LinuxDevice{dev("/dev/nvidia0", "b", 195)}, ResultNotGPUDevice},
		"another character device":        {[]*api.LinuxDevice{dev("/dev/nvidia0", "c", 1)}, ResultNotGPUDevice},
		"no type":                         {[]*api.LinuxDevice{dev("/dev/nvidia0", "", 195)}, ResultNotGPUDevice},
		"a fake beside the control nodes": {[]*api.LinuxDevice{dev("/dev/nvidiactl", "c", 195), dev("/dev/nvidia-uvm", "c", 511), dev("/dev/nvidia1", "b", 7)}, ResultNotGPUDevice},
		"a fake and a GPU":                {[]*api.LinuxDevice{dev("/dev/nvidia0", "b", 7), dev("/dev/nvidia1", "c", 195)}, ResultInjected},
		"only the control node":           {[]*api.LinuxDevice{dev("/dev/nvidiactl", "c", 195)}, ResultNoGPU},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, &folder)
			ctr := gpuContainer("main")
			ctr.Linux.Devices = tc.devices
			adj, _, err := p.CreateContainer(context.Background(), pod("main"), ctr)
			if err != nil {
				t.Fatal(err)
			}
			if injected := len(mountsOf(adj)) > 0; injected != (tc.result == ResultInjected) {
				t.Errorf("mounts %v, want result %s", mountsOf(adj), tc.result)
			}
			if adj == nil && tc.result == ResultInjected || adj != nil && tc.result != ResultInjected {
				t.Errorf("adjustment %v for result %s", adj, tc.result)
			}
			if !reflect.DeepEqual(c, counts{tc.result: 1}) {
				t.Errorf("counted %v, want %s once", c, tc.result)
			}
		})
	}
}

// TestCreateContainerLibraryPath: LD_LIBRARY_PATH from the container's whole
// environment (the image's ENV and the pod's env, as the runtime hands them
// over), the plan's folders merged as ldLibraryPath says.
func TestCreateContainerLibraryPath(t *testing.T) {
	plan := folderPlan("580.159.04")
	plan.LibraryPaths = []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib64/gbm"}
	const driver = "/usr/local/nvidia/lib64:/usr/local/nvidia/lib64/gbm"
	for name, tc := range map[string]struct {
		env  []string
		mode config.LDLibraryPath
		want string // "": no LD_LIBRARY_PATH in the adjustment
	}{
		"none set":                 {env: []string{"PATH=/usr/bin"}, want: driver},
		"the image's own":          {env: []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/app/lib"}, want: "/opt/app/lib:" + driver},
		"empty":                    {env: []string{"LD_LIBRARY_PATH="}, want: driver},
		"one there already":        {env: []string{"LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64"}, want: "/usr/local/cuda/lib64:/usr/local/nvidia/lib64:/usr/local/nvidia/lib64/gbm"},
		"both there already":       {env: []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64/gbm:/usr/local/nvidia/lib64"}},
		"a longer name is another": {env: []string{"LD_LIBRARY_PATH_X=/x", "MY_LD_LIBRARY_PATH=/y"}, want: driver},
		"the first of two":         {env: []string{"LD_LIBRARY_PATH=/a", "LD_LIBRARY_PATH=/b"}, want: "/a:" + driver},
		"prepend":                  {env: []string{"LD_LIBRARY_PATH=/usr/local/cuda/compat/lib:/opt/app/lib"}, mode: config.LDLibraryPathPrepend, want: driver + ":/usr/local/cuda/compat/lib:/opt/app/lib"},
		"prepend, one there":       {env: []string{"LD_LIBRARY_PATH=/opt/app/lib:/usr/local/nvidia/lib64/gbm"}, mode: config.LDLibraryPathPrepend, want: "/usr/local/nvidia/lib64:/opt/app/lib:/usr/local/nvidia/lib64/gbm"},
		"prepend, none set":        {mode: config.LDLibraryPathPrepend, want: driver},
		"append":                   {env: []string{"LD_LIBRARY_PATH=/opt/app/lib"}, mode: config.LDLibraryPathAppend, want: "/opt/app/lib:" + driver},
		"off":                      {env: []string{"LD_LIBRARY_PATH=/opt/app/lib"}, mode: config.LDLibraryPathOff},
		"off, none set":            {mode: config.LDLibraryPathOff},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, &plan)
			p.LDLibraryPath = tc.mode
			ctr := gpuContainer("main")
			ctr.Env = tc.env
			adj, _, err := p.CreateContainer(context.Background(), pod("main"), ctr)
			if err != nil || c[ResultInjected] != 1 {
				t.Fatalf("CreateContainer = %v, %v; counted %v", adj, err, c)
			}
			var want []*api.KeyValue
			if tc.want != "" {
				want = []*api.KeyValue{{Key: "LD_LIBRARY_PATH", Value: tc.want}}
			}
			if !reflect.DeepEqual(adj.Env, want) {
				t.Errorf("env %v, want %v", adj.Env, want)
			}
		})
	}
	// A plan without library folders (a loose-file plan of binaries only)
	// leaves the variable alone.
	plan.LibraryPaths = nil
	p, _ := newPlugin(t, &plan)
	if adj, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main")); err != nil || len(adj.Env) != 0 {
		t.Errorf("no library folders: %v, %v", adj, err)
	}
}

// TestCreateContainerCUDARequirement: a container whose environment requires
// a newer CUDA than the node's driver offers is not created, and the reason
// names the requirement, the node's driver and CUDA version and the label to
// select nodes by; NVIDIA_DISABLE_REQUIRE=true turns the check off.
func TestCreateContainerCUDARequirement(t *testing.T) {
	plan := folderPlan("535.104.05")
	plan.CUDADriverVersion = "12.2"
	noCUDA := folderPlan("535.104.05")
	toolkit := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "535.104.05", CUDADriverVersion: "12.2", RuntimeInjection: layout.RuntimeToolkit}
	for name, tc := range map[string]struct {
		plan   layout.Plan
		env    []string
		result string
		want   []string // in the error
	}{
		"within the driver":        {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.2"}, ResultInjected, nil},
		"a forward-compatible one": {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536"}, ResultInjected, nil},
		"above the driver": {plan, []string{"PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla,driver>=470,driver<471"}, ResultCUDAUnsatisfied, []string{
			`container "main" of pod ml/train`,
			`NVIDIA_REQUIRE_CUDA="cuda>=13.0 brand=tesla,driver>=470,driver<471"`,
			"unsatisfied condition: cuda>=13.0",
			"driver 535.104.05 (CUDA 12.2)",
			"nodeAffinity gpu-injector.io/cuda-driver-version-number Gt 12999",
			"NVIDIA_DISABLE_REQUIRE=true",
		}},
		"a driver range": {plan, []string{"NVIDIA_REQUIRE_DRIVER=driver>=550"}, ResultCUDAUnsatisfied, []string{
			"NVIDIA_REQUIRE_DRIVER", "unsatisfied condition: driver>=550", "select nodes by gpu-injector.io/cuda-driver-version-number or gpu-injector.io/driver-version",
		}},
		"disabled":                {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0", "NVIDIA_DISABLE_REQUIRE=true"}, ResultInjected, nil},
		"disabled by the pod":     {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0", "PATH=/bin", "NVIDIA_DISABLE_REQUIRE=1"}, ResultInjected, nil},
		"not disabled by false":   {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0", "NVIDIA_DISABLE_REQUIRE=false"}, ResultCUDAUnsatisfied, []string{"cuda>=13.0"}},
		"the node's CUDA unknown": {noCUDA, []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0"}, ResultInjected, nil},
		"unreadable": {plan, []string{"NVIDIA_REQUIRE_CUDA=cuda=>13.0"}, ResultCUDAInvalid, []string{
			`NVIDIA_REQUIRE_CUDA="cuda=>13.0"`, "invalid requirement", `"=>" is not one of the operators`, "NVIDIA_DISABLE_REQUIRE=true",
		}},
		// The toolkit checks the requirement itself on a node where it injects.
		"a toolkit node": {toolkit, []string{"NVIDIA_REQUIRE_CUDA=cuda>=13.0"}, ResultRuntimeInjects, nil},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, &tc.plan)
			ctr := gpuContainer("main")
			ctr.Env = tc.env
			adj, _, err := p.CreateContainer(context.Background(), pod("main"), ctr)
			if !reflect.DeepEqual(c, counts{tc.result: 1}) {
				t.Errorf("counted %v, want %s once", c, tc.result)
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("CreateContainer = %v", err)
				}
				return
			}
			if err == nil || adj != nil {
				t.Fatalf("CreateContainer = %v, %v; want a refusal", adj, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not say %q: %v", w, err)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestMountOptions: rro where the kernel has it, else binds that carry no
// mount from below the host path; read-only, nosuid and nodev either way.
func TestMountOptions(t *testing.T) {
	plan := folderPlan("580.159.04")
	for rro, want := range map[bool][]string{
		true:  {"rbind", "rprivate", "ro", "rro", "nosuid", "nodev"},
		false: {"bind", "rprivate", "ro", "nosuid", "nodev"},
	} {
		p, _ := newPlugin(t, &plan)
		p.RecursiveReadOnly = rro
		adj, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range adj.Mounts {
			if !reflect.DeepEqual(m.Options, want) {
				t.Errorf("recursiveReadOnly=%v: %s has options %v, want %v", rro, m.Destination, m.Options, want)
			}
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"5.12.0": true, "5.12": true, "5.15.0-1050-aws": true, "6.8.0-45-generic": true, "6.18.44-fc-v669": true, "10.0": true,
		"5.11.22": false, "5.4.0-150-generic": false, "4.18.0-553.el8_10.x86_64": false, "3.10.0-1160.el7.x86_64": false,
		"": false, "5": false, "x.y": false, "5.x": false,
	} {
		if got := kernelAtLeast(release, 5, 12); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 12) = %v, want %v", release, got, want)
		}
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
// given a 19-file plan (the stat of layout.json included), without an
// environment and with a CUDA image's (its NVIDIA_REQUIRE_CUDA checked,
// LD_LIBRARY_PATH merged).
func BenchmarkCreateContainer(b *testing.B) {
	plan := workload.LooseFilePlan("570.133.20")
	cudaImage := gpuContainer("main")
	cudaImage.Env = []string{
		"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"NVARCH=x86_64", "NV_CUDA_CUDART_VERSION=12.4.127", "CUDA_VERSION=12.4.1",
		"LD_LIBRARY_PATH=/usr/local/cuda/compat/lib:/opt/app/lib",
		"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
		"NVIDIA_REQUIRE_CUDA=" + cudaRequirement("12.4", 470, 525, 535),
		"HOSTNAME=train-0", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "HOME=/root",
	}
	for name, tc := range map[string]struct {
		pod *api.PodSandbox
		ctr *api.Container
	}{
		"unmarked":      {pod(""), gpuContainer("main")},
		"injected":      {pod("main"), gpuContainer("main")},
		"injected-env":  {pod("main"), cudaImage},
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

// cudaRequirement is an NVIDIA_REQUIRE_CUDA in the form NVIDIA's CUDA images
// state it: the release, or a driver branch of its forward compatibility on
// any brand.
func cudaRequirement(cuda string, branches ...int) string {
	parts := []string{"cuda>=" + cuda}
	for _, br := range branches {
		for _, brand := range []string{"tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx", "titan", "titanrtx"} {
			parts = append(parts, fmt.Sprintf("brand=%s,driver>=%d,driver<%d", brand, br, br+1))
		}
	}
	return strings.Join(parts, " ")
}

// manyRequirements is a container environment of n variables, every one a
// distinct NVIDIA_REQUIRE_* that the node satisfies: what a pod's author can
// write to make each of the node's container creations wait on this one.
func manyRequirements(n int) []string {
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("NVIDIA_REQUIRE_X%d=cuda>=1.0", i)
	}
	return env
}

// TestCreateContainerManyRequirements: a container of 100,000 distinct
// NVIDIA_REQUIRE_* variables is refused well within NRI's 2 s timeout for a
// plugin, which would otherwise drop the plugin and stall every container
// creation on the node; with the check off it is injected as fast.
func TestCreateContainerManyRequirements(t *testing.T) {
	plan := folderPlan("580.159.04")
	plan.CUDADriverVersion = "13.0"
	for name, tc := range map[string]struct {
		env    []string
		result string
	}{
		"checked":  {manyRequirements(100_000), ResultCUDAInvalid},
		"disabled": {append(manyRequirements(100_000), "NVIDIA_DISABLE_REQUIRE=true"), ResultInjected},
	} {
		t.Run(name, func(t *testing.T) {
			p, c := newPlugin(t, &plan)
			ctr := gpuContainer("main")
			ctr.Env = tc.env
			start := time.Now()
			_, _, err := p.CreateContainer(context.Background(), pod("main"), ctr)
			took := time.Since(start)
			t.Logf("handled in %s: %v", took, err)
			if took > time.Second {
				t.Errorf("took %s, want well under NRI's 2 s", took)
			}
			if !reflect.DeepEqual(c, counts{tc.result: 1}) {
				t.Errorf("counted %v, want %s once", c, tc.result)
			}
			if (err != nil) != (tc.result != ResultInjected) {
				t.Errorf("CreateContainer = %v", err)
			}
			if err != nil && !strings.Contains(err.Error(), "at most 64") {
				t.Errorf("the refusal does not say how many are allowed: %v", err)
			}
		})
	}
}

// BenchmarkCreateContainerManyRequirements is a container of 100,000
// NVIDIA_REQUIRE_* variables, against NRI's 2 s timeout for a plugin.
func BenchmarkCreateContainerManyRequirements(b *testing.B) {
	plan := folderPlan("580.159.04")
	plan.CUDADriverVersion = "13.0"
	p, _ := newPlugin(b, &plan)
	p.Count = nil
	ctr := gpuContainer("main")
	ctr.Env = manyRequirements(100_000)
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = p.CreateContainer(context.Background(), pod("main"), ctr)
	}
}

// TestCreateContainerDevicePluginNode: on a node whose device plugin mounts
// the driver (GKE's), a marked container gets no mount of the plugin's, only
// the plan's library folder in LD_LIBRARY_PATH, which that plugin leaves unset.
func TestCreateContainerDevicePluginNode(t *testing.T) {
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "535.104.05", RuntimeInjection: layout.RuntimeDevicePlugin,
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	p, c := newPlugin(t, &plan)
	adj, _, err := p.CreateContainer(context.Background(), pod("main"), gpuContainer("main"))
	if err != nil {
		t.Fatal(err)
	}
	want := []*api.KeyValue{{Key: "LD_LIBRARY_PATH", Value: "/usr/local/nvidia/lib64"}}
	if adj == nil || len(adj.Mounts) != 0 || !reflect.DeepEqual(adj.Env, want) {
		t.Fatalf("adjustment %v, want only LD_LIBRARY_PATH %v", adj, want)
	}
	if c[ResultRuntimeInjects] != 1 {
		t.Errorf("counted %v, want %s", c, ResultRuntimeInjects)
	}
}
