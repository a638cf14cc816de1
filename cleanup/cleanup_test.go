package cleanup

import (
	"context"
	"maps"
	"testing"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

func TestConditionIsTheProbes(t *testing.T) {
	if ConditionDriverWedged != nodeprobe.NodeConditionDriverWedged {
		t.Fatalf("cleanup removes condition %s, the probe sets %s", ConditionDriverWedged, nodeprobe.NodeConditionDriverWedged)
	}
}

func gpuNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "gpu-1",
			Labels: map[string]string{
				"kubernetes.io/hostname":  "gpu-1",
				layout.LabelFingerprint:   "abc",
				layout.LabelState:         layout.StateWedged,
				layout.LabelNRIPlugin:     layout.NRIProtocol,
				"gpu-injector.example/ok": "kept: not our prefix",
			},
			Annotations: map[string]string{
				layout.AnnotationLayout:        "{}",
				layout.AnnotationStateReason:   "NVMLTimeout",
				"node.alpha.kubernetes.io/ttl": "0",
			},
		},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
			{Type: ConditionDriverWedged, Status: corev1.ConditionTrue},
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		}},
	}
}

func TestRun(t *testing.T) {
	ns := "gpu-injector"
	plain := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1", Labels: map[string]string{"kubernetes.io/os": "linux"}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	objs := []runtime.Object{
		gpuNode(), plain,
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-webhook", Namespace: ns}},
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-nodeprobe", Namespace: ns}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-pools", Namespace: ns}},
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-pools", Namespace: ns}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpu-injector-test", Namespace: ns}},
		// Someone else's, in the same namespace: kept.
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}},
	}
	c := fake.NewClientset(objs...)
	err := Run(context.Background(), Options{
		Client: c, Namespace: ns,
		WebhookConfiguration: "gpu-injector", WebhookDeployment: "gpu-injector-webhook", ProbeDaemonSet: "gpu-injector-nodeprobe",
		PoolMemory: "gpu-injector-pools",
		// One there, one already gone: not an error.
		Pods: []string{"gpu-injector-test", "gone"},
		Log:  logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n, err := c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{"kubernetes.io/hostname": "gpu-1", "gpu-injector.example/ok": "kept: not our prefix"}
	if !maps.Equal(n.Labels, wantLabels) {
		t.Errorf("labels %v, want %v", n.Labels, wantLabels)
	}
	if want := map[string]string{"node.alpha.kubernetes.io/ttl": "0"}; !maps.Equal(n.Annotations, want) {
		t.Errorf("annotations %v, want %v", n.Annotations, want)
	}
	var types []corev1.NodeConditionType
	for _, cond := range n.Status.Conditions {
		types = append(types, cond.Type)
	}
	if len(types) != 2 || types[0] != corev1.NodeMemoryPressure || types[1] != corev1.NodeReady {
		t.Errorf("conditions %v, want the kubelet's two, in order", types)
	}
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetName() == "cpu-1" {
			t.Errorf("node cpu-1 has nothing of ours, yet was patched: %s", p.GetPatch())
		}
	}
	gone := map[string]error{}
	_, gone["MutatingWebhookConfiguration"] = c.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "gpu-injector", metav1.GetOptions{})
	_, gone["Deployment"] = c.AppsV1().Deployments(ns).Get(ctx, "gpu-injector-webhook", metav1.GetOptions{})
	_, gone["DaemonSet"] = c.AppsV1().DaemonSets(ns).Get(ctx, "gpu-injector-nodeprobe", metav1.GetOptions{})
	_, gone["ConfigMap"] = c.CoreV1().ConfigMaps(ns).Get(ctx, "gpu-injector-pools", metav1.GetOptions{})
	_, gone["Lease"] = c.CoordinationV1().Leases(ns).Get(ctx, "gpu-injector-pools", metav1.GetOptions{})
	_, gone["Pod"] = c.CoreV1().Pods(ns).Get(ctx, "gpu-injector-test", metav1.GetOptions{})
	for kind, err := range gone {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s still there (%v)", kind, err)
		}
	}
	if _, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "other", metav1.GetOptions{}); err != nil {
		t.Errorf("a ConfigMap not ours was deleted: %v", err)
	}
}

// A condition list that changed under the patch: the guard refuses the
// patch instead of removing the kubelet's condition at that index.
func TestConditionPatchGuarded(t *testing.T) {
	n := gpuNode()
	patch, err := ConditionPatch(n)
	if err != nil || patch == nil {
		t.Fatalf("patch %s, %v", patch, err)
	}
	moved := gpuNode()
	moved.Status.Conditions[1], moved.Status.Conditions[2] = moved.Status.Conditions[2], moved.Status.Conditions[1]
	c := fake.NewClientset(moved)
	_, err = c.CoreV1().Nodes().Patch(context.Background(), moved.Name, "application/json-patch+json", patch, metav1.PatchOptions{}, "status")
	if err == nil {
		t.Fatal("the patch removed a condition whose type it did not test")
	}
	if p, _ := ConditionPatch(&corev1.Node{}); p != nil {
		t.Errorf("a node without the condition gets patch %s", p)
	}
}
