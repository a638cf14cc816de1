package nodeprobe

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe/fakeroot"
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
		},
		Annotations: map[string]string{
			layout.AnnotationLayout: enc,
			AnnotationVersionSource: "NVML",
		},
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
		"ready": readyResult(t),
		"error": {Condition: ConditionDriverLibraryVersionMismatch, Message: "x", NVML: NVMLResult{State: NVMLVersionMismatch, Message: "y", Facts: ReadNVML(fakeNVML("580.159.04", 12080, a100mig)).Facts}, DriverVersion: "580.159.04", VersionSource: SourceNVML},
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
