package deviceplugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"

	"golang.org/x/sys/unix"
)

func TestManifest(t *testing.T) {
	data, err := Manifest("registry.example/nvidia/k8s-device-plugin:v0.19.1", "/home/kubernetes/bin/nvidia")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		t.Fatalf("the manifest is not a DaemonSet: %v", err)
	}
	if ds.Name != Name || ds.Namespace != Namespace {
		t.Errorf("DaemonSet %s/%s, want %s/%s", ds.Namespace, ds.Name, Namespace, Name)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example/nvidia/k8s-device-plugin:v0.19.1" {
		t.Errorf("image %q, want the one given", c.Image)
	}
	if !slices.Contains(c.Args, "--pass-device-specs") {
		t.Errorf("args %v lack --pass-device-specs: without the toolkit the containers would get no device node", c.Args)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the plugin is not privileged: NVML could not open /dev/nvidiactl")
	}
	var root string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "driver-root" && v.HostPath != nil {
			root = v.HostPath.Path
		}
	}
	if root != "/home/kubernetes/bin/nvidia" {
		t.Errorf("driver-root %q, want the folder given", root)
	}
	if !strings.Contains(manifest, "image: nvcr.io/nvidia/k8s-device-plugin:"+Version+"\n") {
		t.Errorf("the manifest names no nvcr.io image of %s, the version hack/tools.sh builds", Version)
	}
}

func TestToolsBuildsVersion(t *testing.T) {
	versions, err := os.ReadFile("../cluster/versions.env")
	if err != nil {
		t.Fatal(err)
	}
	if want := "\nNVIDIA_DEVICE_PLUGIN_VERSION=" + Version + "\n"; !strings.Contains(string(versions), want) {
		t.Errorf("e2e/cluster/versions.env, which hack/tools.sh builds from, does not name %s (want %q)", Version, want)
	}
}

func TestCreateDeviceNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("mknod needs root: run as root, as the e2e suite does")
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A real driver's node stays as it is.
	if err := os.WriteFile(filepath.Join(root, "dev/nvidia0"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o077)
	made, err := CreateDeviceNodes(root, 2)
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(made)
	want := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidiactl"}
	for i := range want {
		want[i] = filepath.Join(root, want[i])
	}
	if !slices.Equal(made, want) {
		t.Fatalf("made %v, want %v", made, want)
	}
	for p, mm := range DeviceNodes(2) {
		if p == "/dev/nvidia0" {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Mode&0o777 != 0o666 || unix.Major(st.Rdev) != mm[0] || unix.Minor(st.Rdev) != mm[1] {
			t.Errorf("%s: mode %o, device %d:%d, want a character device 0666 %d:%d", p, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), mm[0], mm[1])
		}
	}
	if err := RemoveDeviceNodes(made); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(root, "dev/*"))
	if !slices.Equal(left, []string{filepath.Join(root, "dev/nvidia0")}) {
		t.Errorf("left %v, want only the node that was there before", left)
	}
}

// TestManifestRunsOnPlainClusters: the plugin's DaemonSet selects a node
// where gpu-injector's probe found a driver, whatever else labels it, or a
// node labelled a GPU node by feature discovery (or by hand); never a node
// where the probe found no driver, nor one nothing labels.
func TestManifestRunsOnPlainClusters(t *testing.T) {
	data, err := Manifest("registry.example/nvidia/k8s-device-plugin:v0.19.1", "/usr/local/nvidia")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.NodeSelector) > 0 {
		t.Fatalf("nodeSelector %v: a plain cluster has no such label", spec.NodeSelector)
	}
	sel := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: spec})
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{layout.LabelState: layout.StateReady, "kubernetes.io/os": "linux"}, true},
		{map[string]string{layout.LabelState: layout.StateWedged}, true},
		{map[string]string{layout.LabelState: layout.StateError}, true},
		{map[string]string{layout.LabelState: layout.StateNoDriver}, false},
		{map[string]string{"nvidia.com/gpu.present": "true"}, true},
		{map[string]string{"kubernetes.io/os": "linux"}, false},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: tc.labels}}
		if got, err := sel.Match(node); err != nil || got != tc.want {
			t.Errorf("node labelled %v: runs the plugin %v (%v), want %v", tc.labels, got, err, tc.want)
		}
	}
}
