// Command gen writes precheck's offline example, a cluster as `kubectl get
// nodes,ns -o yaml` prints it, with real layout fingerprints:
//
//	go run ./precheck/testdata/gen > precheck/testdata/cluster.yaml
package main

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

func folders(version, root string) layout.Plan {
	return layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: version, LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{
			{HostPath: root + "/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
			{HostPath: root + "/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
		}}
}

// node is a node as a probe publishes it; a nil plan is a node no probe
// has labelled.
func node(name string, p *layout.Plan, gpus int64, labels map[string]string) corev1.Node {
	n := corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if gpus > 0 {
		n.Status.Capacity["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
		n.Status.Allocatable["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	for k, v := range labels {
		n.Labels[k] = v
	}
	if p != nil {
		enc, err := layout.Encode(*p)
		if err != nil {
			panic(err)
		}
		n.Annotations = map[string]string{layout.AnnotationLayout: enc}
		n.Labels[layout.LabelState] = layout.StateReady
		n.Labels[layout.LabelFingerprint] = p.Fingerprint()
		n.Labels[layout.LabelDriverVersion] = p.DriverVersion
	}
	return n
}

// trimmed is o without the empty fields a Go struct marshals and an API
// server leaves out.
func trimmed(o any) map[string]any {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		panic(err)
	}
	unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u, "status", "nodeInfo")
	unstructured.RemoveNestedField(u, "status", "daemonEndpoints")
	if conds, ok, _ := unstructured.NestedSlice(u, "status", "conditions"); ok {
		for _, c := range conds {
			delete(c.(map[string]any), "lastHeartbeatTime")
			delete(c.(map[string]any), "lastTransitionTime")
		}
		_ = unstructured.SetNestedSlice(u, conds, "status", "conditions")
	}
	if spec, ok := u["spec"].(map[string]any); ok && len(spec) == 0 {
		delete(u, "spec")
	}
	if st, ok := u["status"].(map[string]any); ok && len(st) == 0 {
		delete(u, "status")
	}
	return u
}

func namespace(name string, labels map[string]string) corev1.Namespace {
	return corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func main() {
	nri := folders("550.54.14", "/usr/lib/nvidia-550")
	toolkit := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "535.104.05", Mounts: []layout.Mount{}, LibraryPaths: []string{}, RuntimeInjection: layout.RuntimeToolkit}
	hostPath := folders("470.256.02", "/home/kubernetes/bin/nvidia")
	cpu := node("cpu-1", nil, 0, map[string]string{layout.LabelState: layout.StateNoDriver})
	optIn := map[string]string{layout.LabelInject: layout.InjectEnabled}
	objects := []any{
		node("gpu-nri", &nri, 8, map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol}),
		node("gpu-toolkit", &toolkit, 4, nil),
		node("gpu-hostpath", &hostPath, 2, map[string]string{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}),
		node("gpu-noalloc", &hostPath, 0, nil),
		node("gpu-unprobed", nil, 1, map[string]string{"nvidia.com/gpu.present": "true"}),
		cpu,
		namespace("default", nil),
		namespace("kube-system", nil),
		namespace("ml", optIn),
		namespace("research", map[string]string{layout.LabelInject: layout.InjectEnabled, "pod-security.kubernetes.io/enforce": "baseline"}),
	}
	items := make([]any, 0, len(objects))
	for _, o := range objects {
		switch v := o.(type) {
		case corev1.Node:
			items = append(items, trimmed(&v))
		case corev1.Namespace:
			items = append(items, trimmed(&v))
		}
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}, "items": items}
	b, err := yaml.Marshal(list)
	if err != nil {
		panic(err)
	}
	fmt.Print("# precheck's offline example: go run ./precheck/testdata/gen > precheck/testdata/cluster.yaml\n")
	os.Stdout.Write(b)
}
