// Command gen writes the golden tests' default cluster of Nodes.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

func node(name string, p layout.Plan, gpus int64, labels map[string]string, taints []corev1.Taint, ready bool, override func(*corev1.Node)) corev1.Node {
	enc, _ := layout.Encode(p)
	l := map[string]string{"kubernetes.io/hostname": name, layout.LabelFingerprint: p.Fingerprint(), layout.LabelState: layout.StateReady, layout.LabelDriverVersion: p.DriverVersion}
	for k, v := range labels {
		l[k] = v
	}
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	n := corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: map[string]string{layout.AnnotationLayout: enc}},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI), "cpu": resource.MustParse("16")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}},
		},
	}
	if override != nil {
		override(&n)
	}
	return n
}

const lib, bin = "/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"

// loose is a distribution's packaged driver: libraries file by file in a
// shared folder, nvidia-smi in /usr/bin.
func loose(version, cuda, libDir string) layout.Plan {
	p := layout.Plan{SchemaVersion: "v1", DriverVersion: version, CUDADriverVersion: cuda, LibraryPaths: []string{lib}}
	for _, f := range []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm"} {
		so := ".so.1"
		if f == "libnvidia-nvvm" {
			so = ".so.4"
		}
		p.Mounts = append(p.Mounts, layout.Mount{libDir + "/" + f + ".so." + version, lib + "/" + f + so, layout.KindFile})
	}
	p.Mounts = append(p.Mounts, layout.Mount{"/usr/bin/nvidia-smi", bin + "/nvidia-smi", layout.KindFile})
	return p
}

// modern is a cluster of today's nodes, where none of the classic tutorials'
// driver folders exists: RHEL with NVIDIA's packages, GKE with another device
// plugin than GKE's (the probe plans mounts of /home/kubernetes/bin/nvidia),
// Ubuntu's packaged driver, a node whose GPUs come through DRA (no
// allocatable nvidia.com/gpu), nodes whose container runtime injects the
// driver, and GKE as it runs by default, whose device plugin mounts the
// driver itself.
func modern() []corev1.Node {
	rhel := loose("570.133.20", "12.8", "/usr/lib64")
	ubuntu := loose("550.144.03", "12.4", "/usr/lib/x86_64-linux-gnu")
	dra := loose("580.95.05", "13.0", "/usr/lib/x86_64-linux-gnu")
	gke := layout.Plan{SchemaVersion: "v1", DriverVersion: "535.230.02", CUDADriverVersion: "12.2", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/home/kubernetes/bin/nvidia/lib64", lib, layout.KindDirectory}, {"/home/kubernetes/bin/nvidia/bin", bin, layout.KindDirectory}}}
	toolkit := layout.Plan{SchemaVersion: "v1", DriverVersion: "560.35.03", CUDADriverVersion: "12.6", RuntimeInjection: layout.RuntimeToolkit}
	cdi := layout.Plan{SchemaVersion: "v1", DriverVersion: "570.86.15", CUDADriverVersion: "12.8", RuntimeInjection: layout.RuntimeCDI}
	gkeDevicePlugin := layout.Plan{SchemaVersion: "v1", DriverVersion: "550.90.07", CUDADriverVersion: "12.4", RuntimeInjection: layout.RuntimeDevicePlugin, LibraryPaths: []string{lib}}
	taint := []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
	return []corev1.Node{
		node("gpu-rhel-1", rhel, 4, map[string]string{"accelerator": "nvidia-l4"}, nil, true, nil),
		node("gpu-rhel-2", rhel, 4, map[string]string{"accelerator": "nvidia-l4"}, nil, true, nil),
		node("gpu-gke-1", gke, 4, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4", "accelerator": "nvidia-tesla-t4"}, taint, true, nil),
		node("gpu-ubuntu-1", ubuntu, 2, map[string]string{"accelerator": "nvidia-tesla-v100"}, nil, true, nil),
		// Its 8 GPUs are in ResourceSlices, which the golden cases add.
		node("gpu-dra-1", dra, 0, map[string]string{"accelerator": "nvidia-h100"}, nil, true, func(n *corev1.Node) {
			delete(n.Status.Allocatable, "nvidia.com/gpu")
		}),
		node("gpu-toolkit-1", toolkit, 4, map[string]string{"accelerator": "nvidia-a10g"}, nil, true, nil),
		node("gpu-cdi-1", cdi, 2, map[string]string{"accelerator": "nvidia-l40s"}, nil, true, nil),
		node("gpu-gke-l4-1", gkeDevicePlugin, 1, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4", "accelerator": "nvidia-l4-gke"}, taint, true, nil),
	}
}

// cuda is a cluster of two drivers, whose probes publish the CUDA version
// each supports as layout.LabelCUDADriverVersionNumber: GKE's 535 (CUDA
// 12.2) on more GPUs, Ubuntu's 550 (CUDA 12.4).
func cuda() []corev1.Node {
	gke := layout.Plan{SchemaVersion: "v1", DriverVersion: "535.230.02", CUDADriverVersion: "12.2", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/home/kubernetes/bin/nvidia/lib64", lib, layout.KindDirectory}, {"/home/kubernetes/bin/nvidia/bin", bin, layout.KindDirectory}}}
	ubuntu := loose("550.144.03", "12.4", "/usr/lib/x86_64-linux-gnu")
	number := func(p layout.Plan) func(*corev1.Node) {
		n, _ := layout.CUDAVersionNumber(p.CUDADriverVersion)
		return func(node *corev1.Node) {
			node.Labels[layout.LabelCUDADriverVersion] = p.CUDADriverVersion
			node.Labels[layout.LabelCUDADriverVersionNumber] = strconv.Itoa(n)
		}
	}
	return []corev1.Node{
		node("gpu-gke-1", gke, 8, map[string]string{"accelerator": "nvidia-tesla-t4"}, nil, true, number(gke)),
		node("gpu-gke-2", gke, 8, map[string]string{"accelerator": "nvidia-tesla-t4"}, nil, true, number(gke)),
		node("gpu-ubuntu-1", ubuntu, 2, map[string]string{"accelerator": "nvidia-tesla-v100"}, nil, true, number(ubuntu)),
		node("gpu-ubuntu-2", ubuntu, 2, map[string]string{"accelerator": "nvidia-tesla-v100"}, nil, true, number(ubuntu)),
	}
}

// nri is a cluster moving to runtime injection: the classic-folder and
// loose-file nodes run gpu-injector's NRI plugin, the GKE-folder ones
// (containerd 1.6, no NRI) do not, and a toolkit node's runtime injects by
// itself, plugin or not.
func nri() []corev1.Node {
	ubuntu := layout.Plan{SchemaVersion: "v1", DriverVersion: "384.130", CUDADriverVersion: "9.0", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/usr/lib/nvidia-384", lib, layout.KindDirectory}, {"/usr/lib/nvidia-384/bin", bin, layout.KindDirectory}}}
	rhel := loose("570.133.20", "12.8", "/usr/lib64")
	gke := layout.Plan{SchemaVersion: "v1", DriverVersion: "535.230.02", CUDADriverVersion: "12.2", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/home/kubernetes/bin/nvidia/lib64", lib, layout.KindDirectory}, {"/home/kubernetes/bin/nvidia/bin", bin, layout.KindDirectory}}}
	toolkit := layout.Plan{SchemaVersion: "v1", DriverVersion: "560.35.03", CUDADriverVersion: "12.6", RuntimeInjection: layout.RuntimeToolkit}
	plugin := func(n *corev1.Node) { n.Labels[layout.LabelNRIPlugin] = layout.NRIProtocol }
	return []corev1.Node{
		node("gpu-ubuntu-1", ubuntu, 8, map[string]string{"accelerator": "nvidia-tesla-k80"}, nil, true, plugin),
		node("gpu-ubuntu-2", ubuntu, 8, map[string]string{"accelerator": "nvidia-tesla-k80"}, nil, true, plugin),
		node("gpu-rhel-1", rhel, 4, map[string]string{"accelerator": "nvidia-l4"}, nil, true, plugin),
		node("gpu-rhel-2", rhel, 4, map[string]string{"accelerator": "nvidia-l4"}, nil, true, plugin),
		node("gpu-gke-1", gke, 4, map[string]string{"accelerator": "nvidia-tesla-t4"}, nil, true, nil),
		// One node of the layout without the plugin: the layout is not
		// runtime-ready, as a pod may land on that node.
		node("gpu-gke-2", gke, 4, map[string]string{"accelerator": "nvidia-tesla-t4"}, nil, true, plugin),
		node("gpu-toolkit-1", toolkit, 4, map[string]string{"accelerator": "nvidia-a10g"}, nil, true, plugin),
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "modern" {
		write(modern(), "nodes-modern.yaml", "A cluster of today's nodes, where the classic tutorials' driver folders do not exist")
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "cuda" {
		write(cuda(), "nodes-cuda.yaml", "A cluster whose probes publish each node's CUDA version as a number a nodeAffinity Gt can compare")
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "nri" {
		write(nri(), "nodes-nri.yaml", "A cluster where some nodes inject the driver at the runtime (gpu-injector's NRI plugin)")
		return
	}
	ubuntu := layout.Plan{SchemaVersion: "v1", DriverVersion: "384.130", CUDADriverVersion: "9.0", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/usr/lib/nvidia-384", lib, layout.KindDirectory}, {"/usr/lib/nvidia-384/bin", bin, layout.KindDirectory}}}
	gke := layout.Plan{SchemaVersion: "v1", DriverVersion: "535.104.05", CUDADriverVersion: "12.2", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/home/kubernetes/bin/nvidia/lib64", lib, layout.KindDirectory}, {"/home/kubernetes/bin/nvidia/bin", bin, layout.KindDirectory}}}
	v := "550.54.15"
	distro := layout.Plan{SchemaVersion: "v1", DriverVersion: v, CUDADriverVersion: "12.4", LibraryPaths: []string{lib}}
	for _, f := range []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm"} {
		so := ".so.1"
		if f == "libnvidia-nvvm" {
			so = ".so.4"
		}
		distro.Mounts = append(distro.Mounts,
			layout.Mount{"/usr/lib/x86_64-linux-gnu/" + f + ".so." + v, lib + "/" + f + so, layout.KindFile})
	}
	distro.Mounts = append(distro.Mounts, layout.Mount{"/usr/bin/nvidia-smi", bin + "/nvidia-smi", layout.KindFile})
	hostile := layout.Plan{SchemaVersion: "v1", DriverVersion: "999.0", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/", lib, layout.KindDirectory}, {"/etc", bin, layout.KindDirectory}}}
	hostile2 := layout.Plan{SchemaVersion: "v1", DriverVersion: "999.1", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/usr/local/nvidia/../../etc", lib, layout.KindDirectory}, {"usr/lib/nvidia", bin, layout.KindDirectory}}}
	hostile3 := layout.Plan{SchemaVersion: "v1", DriverVersion: "999.2", LibraryPaths: []string{lib},
		Mounts: []layout.Mount{{"/usr/lib/x86_64-linux-gnu", lib, layout.KindDirectory}, {"/usr/local/nvidia/bin", "/bin", layout.KindDirectory}}}

	taint := []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
	var nodes []corev1.Node
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, node(fmt.Sprintf("gpu-ubuntu-%d", i), ubuntu, 8, map[string]string{"accelerator": "nvidia-tesla-k80"}, nil, true, nil))
	}
	for i := 1; i <= 2; i++ {
		nodes = append(nodes, node(fmt.Sprintf("gpu-gke-%d", i), gke, 4, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4", "accelerator": "nvidia-tesla-t4"}, taint, true, nil))
	}
	for i := 1; i <= 2; i++ {
		nodes = append(nodes, node(fmt.Sprintf("gpu-a100-%d", i), distro, 8, map[string]string{"accelerator": "nvidia-a100"}, nil, true, nil))
	}
	// Not usable, each for its own reason; they offer the most GPUs so a
	// mistake in the index would show in every golden file.
	nodes = append(nodes, node("gpu-notready", ubuntu, 64, map[string]string{"accelerator": "nvidia-tesla-k80"}, nil, false, func(n *corev1.Node) {
		n.Labels[layout.LabelFingerprint] = "notreadyfingerprint1"
		p := ubuntu
		p.DriverVersion = "390.0"
		n.Labels[layout.LabelFingerprint] = p.Fingerprint()
		n.Annotations[layout.AnnotationLayout], _ = layout.Encode(p)
	}))
	nodes = append(nodes, node("gpu-hostile-root", hostile, 100, nil, nil, true, nil))
	nodes = append(nodes, node("gpu-hostile-dotdot", hostile2, 100, nil, nil, true, nil))
	nodes = append(nodes, node("gpu-hostile-shared", hostile3, 100, nil, nil, true, nil))
	nodes = append(nodes, node("gpu-garbage", ubuntu, 100, nil, nil, true, func(n *corev1.Node) {
		n.Annotations[layout.AnnotationLayout] = `{"schemaVersion":"v1","mounts":[{"hostPath":"/"`
	}))
	nodes = append(nodes, node("gpu-wrong-fingerprint", ubuntu, 100, nil, nil, true, func(n *corev1.Node) {
		n.Labels[layout.LabelFingerprint] = "0000000000deadbeef00"
	}))
	nodes = append(nodes, node("gpu-cordoned", gke, 100, map[string]string{"accelerator": "nvidia-a100"}, nil, true, func(n *corev1.Node) {
		n.Spec.Unschedulable = true
	}))
	nodes = append(nodes, node("gpu-probe-error", ubuntu, 100, nil, nil, true, func(n *corev1.Node) {
		n.Labels[layout.LabelState] = layout.StateError
	}))
	cpu := corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "cpu-1", Labels: map[string]string{"kubernetes.io/hostname": "cpu-1"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	nodes = append(nodes, cpu)
	write(nodes, "nodes.yaml", "The default cluster of the golden tests")
}

func write(nodes []corev1.Node, file, title string) {
	var docs []string
	for _, n := range nodes {
		u, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&n)
		unstructured.RemoveNestedField(u, "status", "nodeInfo")
		unstructured.RemoveNestedField(u, "status", "daemonEndpoints")
		unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
		conds, _, _ := unstructured.NestedSlice(u, "status", "conditions")
		for _, c := range conds {
			delete(c.(map[string]any), "lastHeartbeatTime")
			delete(c.(map[string]any), "lastTransitionTime")
		}
		unstructured.SetNestedSlice(u, conds, "status", "conditions")
		b, _ := yaml.Marshal(u)
		docs = append(docs, strings.TrimSpace(string(b)))
	}
	arg := ""
	switch file {
	case "nodes-modern.yaml":
		arg = " modern"
	case "nodes-nri.yaml":
		arg = " nri"
	}
	fmt.Fprintf(os.Stdout, "# %s. Generated, fingerprints real:\n#   go run ./webhook/inject/testdata/gen%s > webhook/inject/testdata/%s\n---\n%s\n", title, arg, file, strings.Join(docs, "\n---\n"))
}
