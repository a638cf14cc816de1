package nodeprobe_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/mutate"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

// classicManifests are the seed-style manifests the project ships: what
// users of the old GPU tutorials apply. Paths are from this package's folder.
var classicManifests = []string{
	"../hack/demo/manifests/nvidia-smi-job.yaml",
	"../hack/demo/manifests/cuda-check-k80.yaml",
	"../hack/demo/manifests/cuda-check-p100.yaml",
	"../hack/demo/manifests/tensorflow-style.yaml",
	"../hack/gpu/cluster/cuda-pod.yaml",
	"../hack/gpu/cluster/nvidia-smi-job.yaml",
	// With hand-written driver mounts of the old tutorials, which the
	// webhook replaces with the node's layout.
	"../webhook/inject/testdata/legacy-handmounted-nvidia-384.yaml",
	"../webhook/inject/testdata/legacy-k8s-docs-nvidia-375.yaml",
	"../webhook/inject/testdata/legacy-tensorflow-libcuda-files.yaml",
	"../webhook/inject/testdata/legacy-gke-home-kubernetes.yaml",
	"../webhook/inject/testdata/legacy-aks-usr-local-nvidia.yaml",
	"../webhook/inject/testdata/legacy-centos-usr-lib64-nvidia.yaml",
	"../webhook/inject/testdata/legacy-nvidia-docker-volume.yaml",
}

// TestClassicManifestsOnEveryLayout is the end-to-end promise of the project
// without a cluster: for every fake root, the probe's plan is published on a
// Node exactly as the agent would, `gpu-injector mutate` injects each classic
// manifest against that Node, and then, inside the fake root and following
// only the pod's mounts (as the container would see them, links included),
// libcuda.so.1 and libnvidia-ml.so.1 must resolve to that node's driver
// version and nvidia-smi to that driver's program. A node whose runtime
// injects the driver must get pods with no mount and no pin to its layout.
func TestClassicManifestsOnEveryLayout(t *testing.T) {
	for _, name := range fakeroot.Names() {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			l, err := fakeroot.Build(root, name)
			if err != nil {
				t.Fatal(err)
			}
			// The real NVML path: the fake libnvidia-ml lacks NVML's symbols,
			// so the probe refuses to load it and reads the files.
			res, err := nodeprobe.Probe(nodeprobe.ProbeOptions{HostRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Ready() {
				if l.DriverVersion != "" && !strings.HasPrefix(name, "hostile-stubs") {
					t.Fatalf("a layout with driver %s is not ready: %s", l.DriverVersion, res.Reason())
				}
				return
			}
			pub, err := nodeprobe.Desired(res)
			if err != nil {
				t.Fatal(err)
			}
			for _, manifest := range classicManifests {
				t.Run(strings.TrimSuffix(filepath.Base(manifest), ".yaml"), func(t *testing.T) {
					specs := mutateAgainst(t, manifest, pub)
					for _, spec := range specs {
						checkContainers(t, root, l, res.Plan, spec)
					}
				})
			}
		})
	}
}

// mutateAgainst runs `gpu-injector mutate` on a manifest with one Node that
// carries what the probe published, the GPU the device plugin advertises, and
// the labels the manifest's pods select; it returns the mutated pod specs.
func mutateAgainst(t *testing.T, manifest string, pub nodeprobe.Published) []corev1.PodSpec {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	// The webhook's golden cases start with a document of test settings:
	// only the Kubernetes objects go to mutate.
	var objects []string
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains("\n"+doc, "\nkind:") {
			objects = append(objects, doc)
		}
	}
	data = []byte(strings.Join(objects, "\n---\n"))
	manifest = filepath.Join(t.TempDir(), filepath.Base(manifest))
	if err := os.WriteFile(manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	node := corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{}, Annotations: pub.Annotations},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	for k, v := range pub.Labels {
		node.Labels[k] = v
	}
	for _, spec := range podSpecs(t, data) {
		for k, v := range spec.NodeSelector {
			node.Labels[k] = v
		}
	}
	nodeYAML, err := yaml.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	nodesFile := filepath.Join(dir, "nodes.yaml")
	if err := os.WriteFile(nodesFile, nodeYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := mutate.Run(mutate.Options{File: manifest, NodeFiles: []string{nodesFile}}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("gpu-injector mutate -f %s: %v\n%s", manifest, err, stderr.String())
	}
	return podSpecs(t, stdout.Bytes())
}

// podSpecs returns the pod specs of the Pods and workloads in a YAML stream.
func podSpecs(t *testing.T, data []byte) []corev1.PodSpec {
	t.Helper()
	var out []corev1.PodSpec
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatal(err)
		}
		var spec any
		switch doc["kind"] {
		case "Pod":
			spec = doc["spec"]
		case "Job", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet":
			spec = doc["spec"].(map[string]any)["template"].(map[string]any)["spec"]
		default:
			continue
		}
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		var ps corev1.PodSpec
		if err := json.Unmarshal(b, &ps); err != nil {
			t.Fatal(err)
		}
		out = append(out, ps)
	}
	if len(out) == 0 {
		t.Fatal("no pod spec in the manifest")
	}
	return out
}

var versionSuffix = regexp.MustCompile(`\.so\.([0-9]+\.[0-9]+(\.[0-9]+)?)$`)

func checkContainers(t *testing.T, root string, l fakeroot.Layout, plan *layout.Plan, spec corev1.PodSpec) {
	t.Helper()
	switch fp, pinned := spec.NodeSelector[layout.LabelFingerprint]; {
	case plan.RuntimeInjection != "" && pinned:
		// Nodes whose runtime injects the driver are one pool, whatever the image.
		t.Errorf("the pod is pinned to layout %s of a node whose runtime injects the driver: node selector %v", fp, spec.NodeSelector)
	case plan.RuntimeInjection == "" && fp != plan.Fingerprint():
		t.Errorf("the pod is not pinned to the layout: node selector %v", spec.NodeSelector)
	}
	vols := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			vols[v.Name] = v.HostPath
		}
	}
	for _, c := range spec.Containers {
		if !wantsGPU(c) {
			continue
		}
		mounts := map[string]string{} // container path -> host path
		for _, m := range c.VolumeMounts {
			if hp, ok := vols[m.Name]; ok {
				// The user's own data folders (/data) may be writable; the driver's never.
				if !m.ReadOnly && strings.HasPrefix(m.MountPath, "/usr/local/nvidia") {
					t.Errorf("%s: hostPath mount %s is writable", c.Name, m.MountPath)
				}
				mounts[m.MountPath] = hp.Path
			}
		}
		ldPath := ""
		for _, e := range c.Env {
			if e.Name == "LD_LIBRARY_PATH" {
				ldPath = e.Value
			}
		}
		if plan.RuntimeInjection != "" {
			// The runtime puts the driver in; a mount of ours at the same
			// paths would break the container.
			for cp := range mounts {
				if strings.HasPrefix(cp, "/usr/local/nvidia") {
					t.Errorf("%s: a runtime-injected node got a driver mount at %s", c.Name, cp)
				}
			}
			if plan.RuntimeInjection == layout.RuntimeDevicePlugin {
				// GKE's device plugin mounts its folder at /usr/local/nvidia
				// itself and sets no LD_LIBRARY_PATH: the libraries are
				// found along the one gpu-injector sets: the NRI plugin, at
				// the container's creation, for a pod admitted with the
				// runtime's marker (nriplugin's
				// TestCreateContainerDevicePluginNode), which this offline
				// mutation cannot show.
				for _, lib := range plan.LibraryPaths {
					if !slices.Contains(strings.Split(ldPath, ":"), lib) {
						ldPath = strings.TrimPrefix(ldPath+":"+lib, ":")
					}
				}
				checkDriver(t, c.Name, root, l, map[string]string{"/usr/local/nvidia": "/home/kubernetes/bin/nvidia"}, ldPath)
			}
			continue
		}
		checkDriver(t, c.Name, root, l, mounts, ldPath)
	}
}

// checkDriver resolves, through a container's mounts only, libcuda.so.1 and
// libnvidia-ml.so.1 along LD_LIBRARY_PATH and /usr/local/nvidia/bin/nvidia-smi:
// each must be a file of the layout's driver version.
func checkDriver(t *testing.T, container, root string, l fakeroot.Layout, mounts map[string]string, ldPath string) {
	t.Helper()
	for _, so := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
		host, err := findLibrary(root, mounts, strings.Split(ldPath, ":"), so)
		if err != nil {
			t.Errorf("%s: %s: %v", container, so, err)
			continue
		}
		m := versionSuffix.FindStringSubmatch(host)
		if m == nil || m[1] != l.DriverVersion {
			t.Errorf("%s: %s resolves to %s, not the driver %s", container, so, host, l.DriverVersion)
		}
	}
	host, err := containerResolve(root, mounts, "/usr/local/nvidia/bin/nvidia-smi")
	if err != nil {
		t.Errorf("%s: nvidia-smi: %v", container, err)
		return
	}
	data, err := os.ReadFile(filepath.Join(root, host))
	if err != nil || !strings.Contains(string(data), "nvidia-smi "+l.DriverVersion+"\n") {
		t.Errorf("%s: /usr/local/nvidia/bin/nvidia-smi is %s, not the driver %s's (%q, %v)", container, host, l.DriverVersion, data, err)
	}
}

func wantsGPU(c corev1.Container) bool {
	for n := range c.Resources.Limits {
		if strings.Contains(string(n), "nvidia") {
			return true
		}
	}
	return false
}

// findLibrary does what the dynamic loader does with LD_LIBRARY_PATH in the
// container: the first folder holding the name wins.
func findLibrary(root string, mounts map[string]string, dirs []string, name string) (string, error) {
	var tried []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		host, err := containerResolve(root, mounts, path.Join(d, name))
		if err == nil {
			return host, nil
		}
		tried = append(tried, err.Error())
	}
	return "", fmt.Errorf("not found in LD_LIBRARY_PATH %v: %s", dirs, strings.Join(tried, "; "))
}

// containerResolve resolves a container path to the host file it shows,
// through the pod's bind mounts only (the image holds no driver file), and
// following links as the container would: a link's target is a container
// path again. The result is a host path of a regular file.
func containerResolve(root string, mounts map[string]string, p string) (string, error) {
	current := "/"
	todo := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for links := 0; len(todo) > 0; {
		el := todo[0]
		todo = todo[1:]
		switch el {
		case "", ".":
			continue
		case "..":
			current = path.Dir(current)
			continue
		}
		next := path.Join(current, el)
		host, ok := hostOf(mounts, next)
		if !ok {
			// Not under a mount: a folder of the image on the way to one.
			if underMount(mounts, next) {
				current = next
				continue
			}
			return "", fmt.Errorf("%s is in no mount", next)
		}
		fi, err := os.Lstat(filepath.Join(root, host))
		if err != nil {
			return "", fmt.Errorf("%s (host %s): %w", next, host, errors.Unwrap(err))
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if links++; links > 40 {
				return "", errors.New("too many links")
			}
			target, err := os.Readlink(filepath.Join(root, host))
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				current = "/"
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		current = next
		if len(todo) == 0 {
			if !fi.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file", next)
			}
			return host, nil
		}
	}
	return "", fmt.Errorf("%s is a folder", p)
}

// hostOf maps a container path through the deepest mount that holds it.
func hostOf(mounts map[string]string, p string) (string, bool) {
	keys := make([]string, 0, len(mounts))
	for k := range mounts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		if p == k {
			return mounts[k], true
		}
		if strings.HasPrefix(p, k+"/") {
			return path.Join(mounts[k], strings.TrimPrefix(p, k+"/")), true
		}
	}
	return "", false
}

func underMount(mounts map[string]string, p string) bool {
	for k := range mounts {
		if strings.HasPrefix(k, p+"/") {
			return true
		}
	}
	return false
}
