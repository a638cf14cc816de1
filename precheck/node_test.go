package precheck

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

// exampleNode is the example's node of that name, to change.
func exampleNode(t *testing.T, name string) corev1.Node {
	t.Helper()
	nodes, _ := readExample(t)
	for _, n := range nodes {
		if n.Name == name {
			return *n.DeepCopy()
		}
	}
	t.Fatalf("no node %s in %s", name, example)
	return corev1.Node{}
}

// TestNodeStates: a node that lends no layout says why, and what to check;
// only a cordoned one needs no attention.
func TestNodeStates(t *testing.T) {
	for name, tc := range map[string]struct {
		node      func(t *testing.T) corev1.Node
		delivery  string
		why       string
		attention bool
	}{
		"probe error": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelState] = layout.StateError
			n.Annotations[layout.AnnotationStateReason] = `{"reason":"DriverFilesNotAllowed","message":"/opt/nvidia is not allowed"}`
			return n
		}, delivery: DeliveryNone, why: "its probe's state is error", attention: true},
		"wedged": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelState] = layout.StateWedged
			return n
		}, delivery: DeliveryNone, why: "wedged", attention: true},
		"no driver, GPUs advertised": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelState] = layout.StateNoDriver
			return n
		}, delivery: DeliveryNone, why: "found no NVIDIA driver", attention: true},
		"cordoned": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Spec.Unschedulable = true
			return n
		}, delivery: DeliveryNone, why: "cordoned"},
		"not Ready": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Status.Conditions[0].Status = corev1.ConditionFalse
			return n
		}, delivery: DeliveryNone, why: "not Ready", attention: true},
		"a fingerprint that is not its layout's": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelFingerprint] = "0000000000000000000a"
			return n
		}, delivery: DeliveryNone, why: "the webhook ignores the layout it publishes (fingerprint)", attention: true},
		"a layout outside the allowlist": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Annotations[layout.AnnotationLayout] = strings.ReplaceAll(n.Annotations[layout.AnnotationLayout], "/home/kubernetes/bin/nvidia/bin", "/etc")
			return n
		}, delivery: DeliveryNone, why: "(invalid)", attention: true},
		"no annotation": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			delete(n.Annotations, layout.AnnotationLayout)
			return n
		}, delivery: DeliveryNone, why: "has no gpu-injector.io/layout annotation", attention: true},
		"a state the webhook does not know": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelState] = "sleeping"
			return n
		}, delivery: DeliveryNone, why: `"sleeping"`, attention: true},
		"plugin on one node of a layout": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelNRIPlugin] = layout.NRIProtocol
			return n
		}, delivery: DeliveryHostPath, why: "other nodes of layout"},
		"an older plugin": {node: func(t *testing.T) corev1.Node {
			n := exampleNode(t, "gpu-hostpath")
			n.Labels[layout.LabelNRIPlugin] = "v0"
			return n
		}, delivery: DeliveryHostPath, why: `speaks "v0"`},
	} {
		t.Run(name, func(t *testing.T) {
			// The node's layout shares gpu-noalloc's: that keeps it.
			nodes := []corev1.Node{tc.node(t), exampleNode(t, "gpu-noalloc")}
			r := Check(Input{Nodes: nodes, Clock: fixed})
			n := byName(r)["gpu-hostpath"]
			if n.Delivery != tc.delivery || !strings.Contains(n.Why, tc.why) || n.NeedsAttention != tc.attention {
				t.Errorf("%+v\nwant delivery %s, why with %q, attention %v", n, tc.delivery, tc.why, tc.attention)
			}
		})
	}
}

// TestGPUNodeEvidence: what makes a node a GPU node before any probe ran.
func TestGPUNodeEvidence(t *testing.T) {
	for name, tc := range map[string]struct {
		node corev1.Node
		want string
	}{
		"plain":                {node: corev1.Node{}, want: ""},
		"probe found none":     {node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{layout.LabelState: layout.StateNoDriver}}}, want: ""},
		"GPU feature label":    {node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}, want: "nvidia.com/gpu.present=true"},
		"GKE accelerator":      {node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"cloud.google.com/gke-accelerator": "nvidia-l4"}}}, want: "cloud.google.com/gke-accelerator=nvidia-l4"},
		"a label that says no": {node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"nvidia.com/gpu.present": "false"}}}, want: ""},
		"MIG capacity": {node: corev1.Node{Status: corev1.NodeStatus{Capacity: corev1.ResourceList{"nvidia.com/mig-1g.10gb": resource.MustParse("7")}}},
			want: "capacity nvidia.com/mig-1g.10gb: 7"},
		"probed": {node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{layout.LabelState: layout.StateReady}}}, want: layout.LabelState + "=ready"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := gpuEvidence(&tc.node, parseConfig(t, "")); got != tc.want {
				t.Errorf("evidence %q, want %q", got, tc.want)
			}
		})
	}
}
