package mutate

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

// TestClassicManifestsOnEveryProbedLayout runs `gpu-injector mutate` over
// each classic manifest of the golden cases (the tutorials' pods, with their
// hand-written driver mounts) against a node of each fake root layout, as the
// probe publishes it, and follows every GPU container's mounts into that fake
// root: libcuda.so.1 and libnvidia-ml.so.1 on LD_LIBRARY_PATH and
// /usr/local/nvidia/bin/nvidia-smi must resolve to the node's driver files of
// its version, not to a stale or missing folder. Where the probe finds that
// the runtime injects the driver, the pod is left to it: no driver mount, no
// pin on the node's layout.
func TestClassicManifestsOnEveryProbedLayout(t *testing.T) {
	manifests := classicManifests(t)
	if len(manifests) < 6 {
		t.Fatalf("found %d classic manifests, want the golden cases' legacy-*.yaml", len(manifests))
	}
	ready := 0
	for _, name := range fakeroot.Names() {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if _, err := fakeroot.Build(root, name); err != nil {
				t.Fatal(err)
			}
			// No NVML here: the version comes from the driver's file names.
			res, err := nodeprobe.Probe(nodeprobe.ProbeOptions{HostRoot: root, NVMLLibrary: filepath.Join(root, "no-nvml-on-this-machine")})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Ready() {
				t.Skipf("the probe publishes no layout here (%s)", res.Condition)
			}
			runtime := res.Plan.RuntimeInjection != ""
			if !runtime {
				ready++
			}
			nodes := writeProbedNode(t, name, res)
			for file, manifest := range manifests {
				t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
					in := filepath.Join(t.TempDir(), "pod.yaml")
					if err := os.WriteFile(in, manifest, 0o644); err != nil {
						t.Fatal(err)
					}
					var out, stderr bytes.Buffer
					if err := Run(Options{File: in, NodeFiles: []string{nodes}}, nil, &out, &stderr); err != nil {
						t.Fatalf("mutate: %v\n%s", err, stderr.String())
					}
					var pod corev1.Pod
					if err := yaml.Unmarshal(out.Bytes(), &pod); err != nil {
						t.Fatal(err)
					}
					if runtime {
						checkRuntimeInjected(t, res.Plan.Fingerprint(), &pod)
						return
					}
					checkDriverResolves(t, root, res.Plan.DriverVersion, &pod)
				})
			}
		})
	}
	if ready < 3 {
		t.Errorf("only %d fake roots give a plan with mounts", ready)
	}
}

// classicManifests are the Pods of ../webhook/inject/testdata/legacy-*.yaml that run
// with the default configuration and constrain no node.
func classicManifests(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob("../webhook/inject/testdata/legacy-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
files:
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pod []byte
		for _, doc := range strings.Split(string(data), "\n---") {
			var meta struct {
				Kind string `json:"kind"`
				Spec struct {
					NodeSelector map[string]string `json:"nodeSelector"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch meta.Kind {
			case "Pod":
				if len(meta.Spec.NodeSelector) > 0 {
					continue files
				}
				pod = []byte(doc)
			case "":
			default:
				// A configuration of its own (legacyMounts: Keep, ...).
				continue files
			}
		}
		if pod != nil {
			out[f] = pod
		}
	}
	return out
}

// writeProbedNode writes a Ready Node carrying what the probe publishes.
func writeProbedNode(t *testing.T, name string, res nodeprobe.Result) string {
	t.Helper()
	pub, err := nodeprobe.Desired(res)
	if err != nil {
		t.Fatal(err)
	}
	n := corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "node-" + name, Labels: pub.Labels, Annotations: pub.Annotations},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	b, err := yaml.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func checkDriverResolves(t *testing.T, root, version string, pod *corev1.Pod) {
	t.Helper()
	gpus := 0
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok || q.IsZero() {
			continue
		}
		gpus++
		var ldPath string
		for _, e := range c.Env {
			if e.Name == "LD_LIBRARY_PATH" {
				ldPath = e.Value
			}
		}
		for _, so := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
			host, err := loaderFinds(root, pod, &c, strings.Split(ldPath, ":"), so)
			if err != nil {
				t.Errorf("container %q: %s: %v", c.Name, so, err)
				continue
			}
			if want := strings.TrimSuffix(so, ".1") + "." + version; path.Base(host) != want {
				t.Errorf("container %q: %s resolves to host %s, want a file %s of the node's driver", c.Name, so, host, want)
			}
		}
		host, err := containerFile(root, pod, &c, "/usr/local/nvidia/bin/nvidia-smi")
		if err != nil {
			t.Errorf("container %q: /usr/local/nvidia/bin/nvidia-smi: %v", c.Name, err)
		} else if path.Base(host) != "nvidia-smi" {
			t.Errorf("container %q: nvidia-smi resolves to host %s", c.Name, host)
		}
		// A driver volume of the manifest's own that stayed in a GPU
		// container would name a folder this node does not have.
		mounted := map[string]bool{}
		for _, vm := range c.VolumeMounts {
			mounted[vm.Name] = true
		}
		for _, v := range pod.Spec.Volumes {
			if v.HostPath != nil && mounted[v.Name] && !strings.HasPrefix(v.Name, "gpu-injector-") && strings.Contains(v.HostPath.Path, "nvidia") {
				if _, err := os.Lstat(filepath.Join(root, v.HostPath.Path)); err != nil {
					t.Errorf("hand-written volume %q (host %s) stayed, and the node has no such path", v.Name, v.HostPath.Path)
				}
			}
		}
	}
	if gpus == 0 {
		t.Fatalf("no GPU container after mutation: %+v", pod.Spec.Containers)
	}
}

// checkRuntimeInjected: on a node whose runtime injects the driver, the pod
// is pinned there and keeps no driver mount, neither ours nor its own.
func checkRuntimeInjected(t *testing.T, fp string, pod *corev1.Pod) {
	t.Helper()
	// Every node whose runtime injects the driver is one pool: no pin on the
	// one layout, which would split a fleet of node images.
	if got, ok := pod.Spec.NodeSelector["gpu-injector.io/layout-fingerprint"]; ok {
		t.Errorf("nodeSelector fingerprint %q on a runtime-injected node's pod (layout %s), want none", got, fp)
	}
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
			continue
		}
		for _, vm := range c.VolumeMounts {
			for _, v := range pod.Spec.Volumes {
				if v.Name == vm.Name && v.HostPath != nil && (strings.HasPrefix(v.Name, "gpu-injector-") || strings.Contains(v.HostPath.Path, "nvidia")) {
					t.Errorf("container %q mounts driver volume %q (%s) on a runtime-injected node", c.Name, v.Name, v.HostPath.Path)
				}
			}
		}
	}
}

// loaderFinds looks for a library the way the dynamic loader does with
// LD_LIBRARY_PATH: the first folder that has it.
func loaderFinds(root string, pod *corev1.Pod, c *corev1.Container, dirs []string, so string) (string, error) {
	var errs []error
	for _, d := range dirs {
		if d == "" {
			continue
		}
		host, err := containerFile(root, pod, c, path.Join(d, so))
		if err == nil {
			return host, nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(append(errs, errors.New("not found on LD_LIBRARY_PATH "+strings.Join(dirs, ":")))...)
}

// containerFile maps a container path through the container's mounts (the
// deepest mount point wins, as the kubelet stacks them) to the host path it
// shows, resolved inside the fake root.
func containerFile(root string, pod *corev1.Pod, c *corev1.Container, p string) (string, error) {
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		mp := path.Clean(vm.MountPath)
		if (p == mp || strings.HasPrefix(p, mp+"/")) && (best == nil || len(mp) > len(path.Clean(best.MountPath))) {
			best = vm
		}
	}
	if best == nil {
		return "", errors.New("no mount holds " + p + ": the image has no driver")
	}
	var hostPath string
	for _, v := range pod.Spec.Volumes {
		if v.Name == best.Name && v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if hostPath == "" {
		return "", errors.New("mount " + best.Name + " is no hostPath volume")
	}
	host := path.Join(hostPath, strings.TrimPrefix(p, path.Clean(best.MountPath)))
	return resolveInRoot(root, host)
}

// resolveInRoot follows symbolic links in every element as the host would,
// with root as /, and never leaves root.
func resolveInRoot(root, p string) (string, error) {
	todo := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	cur := "/"
	for hops := 0; len(todo) > 0; {
		el := todo[0]
		todo = todo[1:]
		next := path.Join(cur, el)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", errors.New(p + ": too many links")
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), todo...)
	}
	fi, err := os.Stat(filepath.Join(root, cur))
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New(p + " is not a regular file")
	}
	return cur, nil
}

// TestDRAObjectsOffline: `gpu-injector mutate` takes ResourceSlices and
// DeviceClasses with the Nodes (kubectl get nodes,resourceslices,deviceclasses
// -o yaml) and the claim templates with the workloads, and answers as the
// webhook does: the Deployment whose pods claim a GPU only through a template
// is injected, with the layout of the node whose GPUs are in ResourceSlices
// (without them, the RHEL pool would win).
func TestDRAObjectsOffline(t *testing.T) {
	manifest := `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: single-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: claims-a-gpu
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: single-gpu
      containers:
      - name: ctr
        image: ubuntu:22.04
        resources:
          claims:
          - name: gpu
`
	out, stderr, err := runMutate(t, manifest, "-", "../webhook/inject/testdata/nodes-modern.yaml", "../webhook/inject/testdata/nodes-dra-slices.yaml")
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "injected: Deployment/claims-a-gpu") || !strings.Contains(stderr, "driver 580.95.05") {
		t.Errorf("want the Deployment injected with the DRA node's driver 580.95.05; stderr:\n%s", stderr)
	}
	if !strings.Contains(out, "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05") {
		t.Errorf("the output lacks the DRA node's libcuda:\n%s", out)
	}
}
