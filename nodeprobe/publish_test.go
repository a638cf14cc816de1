package nodeprobe

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
)

func patches(c *fake.Clientset) []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func readyResult(t *testing.T) Result {
	t.Helper()
	root, l := buildRoot(t, "usr-local-nvidia")
	res := probeRoot(t, root, openWith(fakeNVML(l.DriverVersion, 13000, h100, h100)))
	if !res.Ready() {
		t.Fatalf("probe: %s", res.Reason())
	}
	return res
}

func TestDesired(t *testing.T) {
	res := readyResult(t)
	p, err := Desired(res)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := layout.Encode(*res.Plan)
	want := Published{
		Labels: map[string]string{
			layout.LabelState:             layout.StateReady,
			layout.LabelFingerprint:       res.Plan.Fingerprint(),
			layout.LabelDriverVersion:     "580.159.04",
			layout.LabelCUDADriverVersion: "13.0",
			layout.LabelGPUProduct:        "NVIDIA-H100-80GB-HBM3",
			layout.LabelGPUCount:          "2",
			layout.LabelGPUMemoryMiB:      "81559",
			layout.LabelComputeCapability: "9.0",
			layout.LabelMIGEnabled:        "false",

			// What a nodeAffinity Gt term compares.
			layout.LabelCUDADriverVersionNumber: "13000",
		},
		Annotations: map[string]string{
			layout.AnnotationLayout: enc,
			AnnotationVersionSource: "NVML",
		},
		Wedged: WedgedCondition{Status: corev1.ConditionFalse, Reason: ReasonDriverAnswers, Message: "NVML answered the probe in time and reports no GPU lost"},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("Desired =\n%v\nwant\n%v", p, want)
	}
	if dec, err := layout.Decode(p.Annotations[layout.AnnotationLayout]); err != nil || !reflect.DeepEqual(dec, *res.Plan) {
		t.Errorf("the annotation does not decode to the plan: %v", err)
	}
}

func TestDesiredMixedNodeAndErrors(t *testing.T) {
	a100mig := mockGPU{name: "NVIDIA A100-SXM4-40GB", memBytes: 40960 << 20, major: 8, minor: 0, mig: 0}
	facts := ReadNVML(fakeNVML("580.159.04", 12080, h100, a100mig))
	res := Result{Condition: ConditionDriverLibraryVersionMismatch, Message: "nvmlInit failed", NVML: facts, DriverVersion: "580.159.04", VersionSource: SourceNVML}
	p, err := Desired(res)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		layout.LabelState: layout.StateError, layout.LabelGPUProduct: "mixed", layout.LabelGPUMemoryMiB: "40960",
		layout.LabelComputeCapability: "8.0", layout.LabelMIGEnabled: "true", layout.LabelCUDADriverVersion: "12.8",
		layout.LabelCUDADriverVersionNumber: "12080",
	} {
		if p.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, p.Labels[k], v)
		}
	}
	if _, ok := p.Labels[layout.LabelFingerprint]; ok {
		t.Error("an error state carries a fingerprint")
	}
	if _, ok := p.Annotations[layout.AnnotationLayout]; ok {
		t.Error("an error state carries a layout")
	}
	if got := p.Annotations[layout.AnnotationStateReason]; got != "DriverLibraryVersionMismatch: nvmlInit failed" {
		t.Errorf("reason %q", got)
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":  "NVIDIA-H100-80GB-HBM3",
		"NVIDIA A100-SXM4-40GB":  "NVIDIA-A100-SXM4-40GB",
		"Tesla K80":              "Tesla-K80",
		"  GeForce  RTX (3090) ": "GeForce-RTX-3090",
		"580.159.04":             "580.159.04",
		"***":                    "",
		"a/b:c":                  "a-b-c",
		"0123456789012345678901234567890123456789012345678901234567890123456789": "012345678901234567890123456789012345678901234567890123456789012",
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPublish(t *testing.T) {
	ctx := context.Background()
	ready := readyResult(t)
	readyPub, err := Desired(ready)
	if err != nil {
		t.Fatal(err)
	}
	errorPub, err := Desired(Result{Condition: ConditionNoDevices, Message: "NVML sees no GPU", DriverVersion: "580.159.04", VersionSource: SourceNVML})
	if err != nil {
		t.Fatal(err)
	}
	// Keys under our prefix that the probe does not publish are an admin's:
	// a label a static layout's nodeSelector uses, the e2e marker.
	foreign := map[string]string{"kubernetes.io/hostname": "gpu-1", "team": "ml", layout.Prefix + "pool": "a100"}
	foreignAnn := map[string]string{"node.alpha.kubernetes.io/ttl": "0", layout.Prefix + "e2e": "api-only"}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   "gpu-1",
		Labels: map[string]string{"kubernetes.io/hostname": "gpu-1", "team": "ml", layout.Prefix + "pool": "a100"},
		// A reason left by an earlier error state is ours and stale.
		Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", layout.Prefix + "e2e": "api-only", layout.AnnotationStateReason: "old"},
	}}
	c := fake.NewSimpleClientset(node)

	// First publish: one patch, naming only owned keys, removing the stale one.
	wrote, err := Publish(ctx, c, "gpu-1", readyPub)
	if err != nil || !wrote {
		t.Fatalf("first Publish = %v, %v; want a write", wrote, err)
	}
	ps := patches(c)
	if len(ps) != 1 {
		t.Fatalf("%d patches, want 1", len(ps))
	}
	var patch struct {
		Metadata map[string]map[string]*string `json:"metadata"`
	}
	if err := json.Unmarshal(ps[0].GetPatch(), &patch); err != nil {
		t.Fatal(err)
	}
	for section, kv := range patch.Metadata {
		for k, v := range kv {
			if !owned[k] {
				t.Errorf("patch %s names a key the probe does not own: %q", section, k)
			}
			if k == layout.AnnotationStateReason && v != nil {
				t.Errorf("stale key not removed: %v", *v)
			}
		}
	}
	got, err := c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range foreign {
		if got.Labels[k] != v {
			t.Errorf("foreign label %s = %q, want %q", k, got.Labels[k], v)
		}
	}
	for k, v := range foreignAnn {
		if got.Annotations[k] != v {
			t.Errorf("foreign annotation %s = %q, want %q", k, got.Annotations[k], v)
		}
	}
	if _, ok := got.Annotations[layout.AnnotationStateReason]; ok {
		t.Error("stale state reason kept")
	}
	if !reflect.DeepEqual(ours(got.Labels), readyPub.Labels) || !reflect.DeepEqual(ours(got.Annotations), readyPub.Annotations) {
		t.Errorf("node has %v %v, want %v %v", ours(got.Labels), ours(got.Annotations), readyPub.Labels, readyPub.Annotations)
	}

	// Steady node: a probe with the same result writes nothing.
	c.ClearActions()
	for range 3 {
		again, err := Desired(readyResult(t))
		if err != nil {
			t.Fatal(err)
		}
		if wrote, err := Publish(ctx, c, "gpu-1", again); err != nil || wrote {
			t.Fatalf("steady Publish = %v, %v; want no write", wrote, err)
		}
	}
	if n := len(patches(c)); n != 0 {
		t.Errorf("%d patches on a steady node, want 0", n)
	}

	// Error state: the layout and fingerprint go, the reason comes.
	if wrote, err := Publish(ctx, c, "gpu-1", errorPub); err != nil || !wrote {
		t.Fatalf("error Publish = %v, %v", wrote, err)
	}
	got, _ = c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if _, ok := got.Annotations[layout.AnnotationLayout]; ok {
		t.Error("layout annotation kept in error state")
	}
	if _, ok := got.Labels[layout.LabelFingerprint]; ok {
		t.Error("fingerprint label kept in error state")
	}
	if got.Labels[layout.LabelState] != layout.StateError || got.Annotations[layout.AnnotationStateReason] != "NoDevices: NVML sees no GPU" {
		t.Errorf("state %q reason %q", got.Labels[layout.LabelState], got.Annotations[layout.AnnotationStateReason])
	}
	if got.Labels["team"] != "ml" || got.Labels[layout.Prefix+"pool"] != "a100" || got.Annotations[layout.Prefix+"e2e"] != "api-only" {
		t.Errorf("foreign keys lost: %v %v", got.Labels, got.Annotations)
	}
}

// TestOwnedKeysCoverDesired keeps owned in step with Desired: a key Desired
// can write but owned lacks would never be removed again.
func TestOwnedKeysCoverDesired(t *testing.T) {
	a100mig := mockGPU{name: "NVIDIA A100-SXM4-40GB", memBytes: 40960 << 20, major: 8, minor: 0, mig: 0}
	for name, res := range map[string]Result{
		"ready":  readyResult(t),
		"wedged": {Condition: ConditionDriverWedged, Message: "NVML does not answer: x", NVML: NVMLResult{State: NVMLTimeout, Message: "x"}},
		"error":  {Condition: ConditionDriverLibraryVersionMismatch, Message: "x", NVML: NVMLResult{State: NVMLVersionMismatch, Message: "y", Facts: ReadNVML(fakeNVML("580.159.04", 12080, a100mig)).Facts}, DriverVersion: "580.159.04", VersionSource: SourceNVML},
	} {
		p, err := Desired(res)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []map[string]string{p.Labels, p.Annotations} {
			for k := range m {
				if !owned[k] {
					t.Errorf("%s: Desired writes %s, which owned lacks", name, k)
				}
			}
		}
	}
}

func TestDesiredWedged(t *testing.T) {
	for cond, nvmlState := range map[Condition]NVMLState{ConditionDriverWedged: NVMLTimeout, ConditionGPULost: NVMLGPULost} {
		t.Run(string(cond), func(t *testing.T) {
			res := Result{Condition: cond, Message: "the message", NVML: NVMLResult{State: nvmlState, Message: "nvml says"}}
			p, err := Desired(res)
			if err != nil {
				t.Fatal(err)
			}
			want := Published{
				Labels: map[string]string{layout.LabelState: layout.StateWedged},
				Annotations: map[string]string{
					layout.AnnotationStateReason: string(cond) + ": the message",
					AnnotationNVMLState:          string(nvmlState) + ": nvml says",
				},
				Wedged: WedgedCondition{Status: corev1.ConditionTrue, Reason: string(cond), Message: "the message"},
			}
			if !reflect.DeepEqual(p, want) {
				t.Errorf("Desired =\n%+v\nwant\n%+v", p, want)
			}
		})
	}
	// Without NVML nothing says the driver is wedged; with an NVML error it answered.
	for state, reason := range map[NVMLState]string{NVMLLibraryNotFound: ReasonNVMLUnavailable, NVMLLibraryInvalid: ReasonNVMLUnavailable, NVMLVersionMismatch: ReasonDriverAnswers, NVMLError: ReasonDriverAnswers} {
		p, err := Desired(Result{Condition: ConditionNVMLError, NVML: NVMLResult{State: state}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Wedged.Status != corev1.ConditionFalse || p.Wedged.Reason != reason || p.Labels[layout.LabelState] != layout.StateError {
			t.Errorf("NVML %s: condition %+v, state %q; want False with %s, state error", state, p.Wedged, p.Labels[layout.LabelState], reason)
		}
	}
}

// TestPublishWedgedCondition: the condition goes through the status
// subresource as a strategic merge of that one condition, is written on a
// change only, and a node that was never wedged never gets it.
func TestPublishWedgedCondition(t *testing.T) {
	ctx := context.Background()
	kubelet := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{kubelet}}})
	readyPub, err := Desired(readyResult(t))
	if err != nil {
		t.Fatal(err)
	}
	wedgedPub, err := Desired(Result{Condition: ConditionDriverWedged, Message: "NVML does not answer: nvmlInit has not returned within 30s (called at 2026-11-26T10:00:00Z)",
		NVML: NVMLResult{State: NVMLTimeout, Message: "nvmlInit has not returned within 30s (called at 2026-11-26T10:00:00Z)"}})
	if err != nil {
		t.Fatal(err)
	}
	statusPatches := func() []k8stesting.PatchAction {
		var out []k8stesting.PatchAction
		for _, p := range patches(c) {
			if p.GetSubresource() == "status" {
				out = append(out, p)
			}
		}
		return out
	}
	get := func() *corev1.Node {
		n, err := c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	cond := func(n *corev1.Node) *corev1.NodeCondition {
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == NodeConditionDriverWedged {
				return &n.Status.Conditions[i]
			}
		}
		return nil
	}

	if _, err := Publish(ctx, c, "gpu-1", readyPub); err != nil {
		t.Fatal(err)
	}
	if n := len(statusPatches()); n != 0 || cond(get()) != nil {
		t.Fatalf("a node that was never wedged got the condition (%d status patches)", n)
	}

	c.ClearActions()
	if wrote, err := Publish(ctx, c, "gpu-1", wedgedPub); err != nil || !wrote {
		t.Fatalf("wedged Publish = %v, %v", wrote, err)
	}
	sp := statusPatches()
	if len(sp) != 1 || len(patches(c)) != 2 || sp[0].GetPatchType() != types.StrategicMergePatchType {
		t.Fatalf("%d patches, %d of status (%v), want a metadata patch and a strategic merge of the status", len(patches(c)), len(sp), sp)
	}
	var body struct {
		Status struct {
			Conditions []map[string]any `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(sp[0].GetPatch(), &body); err != nil {
		t.Fatal(err)
	}
	if raw := string(sp[0].GetPatch()); len(body.Status.Conditions) != 1 || body.Status.Conditions[0]["type"] != string(NodeConditionDriverWedged) || strings.Contains(raw, "metadata") {
		t.Errorf("status patch %s, want exactly the %s condition", raw, NodeConditionDriverWedged)
	}
	n := get()
	wedged := cond(n)
	if wedged == nil || wedged.Status != corev1.ConditionTrue || wedged.Reason != string(ConditionDriverWedged) || wedged.LastTransitionTime.IsZero() {
		t.Fatalf("condition %+v", wedged)
	}
	if !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return reflect.DeepEqual(c, kubelet) }) || len(n.Status.Conditions) != 2 {
		t.Errorf("the kubelet's condition changed: %+v", n.Status.Conditions)
	}

	c.ClearActions()
	if wrote, err := Publish(ctx, c, "gpu-1", wedgedPub); err != nil || wrote || len(patches(c)) != 0 {
		t.Fatalf("steady wedge: wrote %v (%d patches), %v; want no write", wrote, len(patches(c)), err)
	}

	if wrote, err := Publish(ctx, c, "gpu-1", readyPub); err != nil || !wrote {
		t.Fatalf("recovery Publish = %v, %v", wrote, err)
	}
	n = get()
	if got := cond(n); got == nil || got.Status != corev1.ConditionFalse || got.Reason != ReasonDriverAnswers {
		t.Errorf("condition after recovery %+v, want False with %s", got, ReasonDriverAnswers)
	}
	if n.Labels[layout.LabelState] != layout.StateReady {
		t.Errorf("state %q after recovery", n.Labels[layout.LabelState])
	}
	c.ClearActions()
	if wrote, err := Publish(ctx, c, "gpu-1", readyPub); err != nil || wrote || len(patches(c)) != 0 {
		t.Errorf("steady after recovery: wrote %v (%d patches), %v; want no write", wrote, len(patches(c)), err)
	}
}

func TestPublishMissingNode(t *testing.T) {
	c := fake.NewSimpleClientset()
	if _, err := Publish(context.Background(), c, "nope", Published{}); err == nil {
		t.Fatal("Publish on a missing node succeeded")
	}
}

func TestFakerootVersionsMatchLayouts(t *testing.T) {
	// The e2e suite reuses fakeroot: a layout that claims a version must yield it.
	for name, l := range fakeroot.Layouts() {
		if l.DriverVersion == "" {
			continue
		}
		root, _ := buildRoot(t, name)
		if res := probeRoot(t, root, noNVML); res.DriverVersion != l.DriverVersion {
			t.Errorf("%s: probe says %q, layout says %q", name, res.DriverVersion, l.DriverVersion)
		}
	}
}

// TestPublishWedgedConditionForbidden: where the chart grants no Node status
// (no admission policy to narrow it), the wedged state label is still
// written, and the refused condition is told apart from a failed publish.
func TestPublishWedgedConditionForbidden(t *testing.T) {
	ctx := context.Background()
	c := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1"}})
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "gpu-1", errors.New("no status rights"))
	})
	wedgedPub, err := Desired(Result{Condition: ConditionDriverWedged, Message: "NVML does not answer",
		NVML: NVMLResult{State: NVMLTimeout, Message: "nvmlInit has not returned within 30s"}})
	if err != nil {
		t.Fatal(err)
	}
	wrote, err := Publish(ctx, c, "gpu-1", wedgedPub)
	if !wrote || !errors.Is(err, ErrConditionForbidden) {
		t.Fatalf("Publish = %v, %v; want the labels written and ErrConditionForbidden", wrote, err)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, "gpu-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Labels[layout.LabelState]; got != layout.StateWedged {
		t.Errorf("state label %q, want %q", got, layout.StateWedged)
	}
}
