package gpunodes

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

func layoutNodeNames(l *inject.Layout) []string {
	var names []string
	for _, n := range l.Nodes {
		names = append(names, n.Name)
	}
	return names
}

func TestIndexGroupsByFingerprint(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	a, b := gputest.Plan("535.104.05"), gputest.Plan("550.54.15")
	idx.Add(gputest.Node("n3", a, 8, nil))
	idx.Add(gputest.Node("n1", a, 4, nil))
	idx.Add(gputest.Node("n2", b, 2, nil))

	got := idx.Layouts()
	if len(got) != 2 {
		t.Fatalf("got %d layouts, want 2", len(got))
	}
	byFP := map[string]*inject.Layout{}
	for _, l := range got {
		byFP[l.Fingerprint] = l
	}
	la, lb := byFP[a.Fingerprint()], byFP[b.Fingerprint()]
	if la == nil || lb == nil {
		t.Fatalf("layouts %v lack a fingerprint of %s, %s", got, a.Fingerprint(), b.Fingerprint())
	}
	if want := []string{"n1", "n3"}; !slices.Equal(layoutNodeNames(la), want) {
		t.Errorf("layout a nodes = %v, want %v (sorted)", layoutNodeNames(la), want)
	}
	if la.AllocatableGPUs != 12 || lb.AllocatableGPUs != 2 {
		t.Errorf("allocatable GPUs = %d, %d; want 12, 2", la.AllocatableGPUs, lb.AllocatableGPUs)
	}
	if la.Plan.DriverVersion != "535.104.05" || len(la.Plan.Mounts) != 2 {
		t.Errorf("layout a plan = %+v", la.Plan)
	}
	if !slices.IsSortedFunc(got, func(x, y *inject.Layout) int { return cmpString(x.Fingerprint, y.Fingerprint) }) {
		t.Errorf("snapshot not sorted by fingerprint")
	}
	if v := gputest.MetricValue(t, layoutsKnown); v != 2 {
		t.Errorf("gpu_injector_layouts = %v, want 2", v)
	}
	if v := gputest.MetricValue(t, layoutNodes.WithLabelValues(a.Fingerprint())); v != 2 {
		t.Errorf("gpu_injector_layout_nodes{a} = %v, want 2", v)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestIndexUpdateAndDelete(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	a, b := gputest.Plan("535.104.05"), gputest.Plan("550.54.15")
	idx.Add(gputest.Node("n1", a, 8, nil))
	idx.Add(gputest.Node("n2", a, 8, nil))
	before := idx.Layouts()

	// More GPUs on n1: the layout's sum follows, the earlier snapshot does not.
	idx.Update(gputest.Node("n1", a, 16, nil))
	if got := idx.Layouts()[0].AllocatableGPUs; got != 24 {
		t.Errorf("after update allocatable = %d, want 24", got)
	}
	if before[0].AllocatableGPUs != 16 || before[0].Nodes[0].AllocatableGPUs != 8 {
		t.Errorf("published snapshot changed under a reader: %d GPUs, n1 %d", before[0].AllocatableGPUs, before[0].Nodes[0].AllocatableGPUs)
	}

	// A driver upgrade moves n1 to a new layout.
	idx.Update(gputest.Node("n1", b, 16, nil))
	got := idx.Layouts()
	if len(got) != 2 {
		t.Fatalf("after upgrade got %d layouts, want 2", len(got))
	}
	for _, l := range got {
		want := map[string][]string{a.Fingerprint(): {"n2"}, b.Fingerprint(): {"n1"}}[l.Fingerprint]
		if !slices.Equal(layoutNodeNames(l), want) {
			t.Errorf("layout %s nodes = %v, want %v", l.Fingerprint, layoutNodeNames(l), want)
		}
	}

	// The last node of a layout goes: the layout and its gauge go too.
	idx.Delete("n2")
	got = idx.Layouts()
	if len(got) != 1 || got[0].Fingerprint != b.Fingerprint() {
		t.Fatalf("after delete layouts = %v, want only %s", got, b.Fingerprint())
	}
	if gputest.HasLabelValue(t, layoutNodes, a.Fingerprint()) {
		t.Errorf("gauge of the deleted layout %s is still exported", a.Fingerprint())
	}
	if !gputest.HasLabelValue(t, layoutNodes, b.Fingerprint()) {
		t.Errorf("gauge of the live layout %s is missing", b.Fingerprint())
	}

	// Deletes may come as tombstones.
	if err := NewNodeStore(idx).Delete(toolscache.DeletedFinalStateUnknown{Key: "n1", Obj: gputest.Node("n1", b, 16, nil)}); err != nil {
		t.Fatal(err)
	}
	if got := idx.Layouts(); len(got) != 0 {
		t.Errorf("after tombstone delete layouts = %v, want none", got)
	}
	idx.Delete("never-seen")
}

func TestIndexNotCandidates(t *testing.T) {
	p := gputest.Plan("535.104.05")
	cases := map[string]func(*corev1.Node){
		"not ready": func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse },
		"ready unknown": func(n *corev1.Node) {
			n.Status.Conditions[0].Status = corev1.ConditionUnknown
		},
		"no ready condition": func(n *corev1.Node) { n.Status.Conditions = nil },
		"unschedulable":      func(n *corev1.Node) { n.Spec.Unschedulable = true },
		"probe error":        func(n *corev1.Node) { n.Labels[layout.LabelState] = layout.StateError },
		"driver wedged":      func(n *corev1.Node) { n.Labels[layout.LabelState] = layout.StateWedged },
		"no probe":           func(n *corev1.Node) { delete(n.Labels, layout.LabelState) },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			idx := NewIndex(config.Default(), logr.Discard())
			before := rejectedTotal(t)
			idx.Add(gputest.Node("n1", p, 8, mod))
			if got := idx.Layouts(); len(got) != 0 {
				t.Errorf("layouts = %v, want none", got)
			}
			if d := rejectedTotal(t) - before; d != 0 {
				t.Errorf("rejected counter moved by %v for a node that is merely not a candidate", d)
			}
			// Once it recovers, it is a candidate again.
			idx.Update(gputest.Node("n1", p, 8, nil))
			if got := idx.Layouts(); len(got) != 1 {
				t.Errorf("after recovery layouts = %d, want 1", len(got))
			}
		})
	}
}

func wedgedNames(idx *Index) []string {
	var out []string
	for _, w := range idx.Wedged() {
		out = append(out, w.Node.Name+"="+w.Reason)
	}
	return out
}

// TestIndexWedged: the index lists the ready, schedulable nodes whose driver
// is wedged, sorted, with their reason; a heartbeat republishes nothing; a
// node leaves the list when it recovers, goes NotReady or cordoned, or is
// deleted, and the gauge follows.
func TestIndexWedged(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	if got := idx.Wedged(); got == nil || len(got) != 0 {
		t.Fatalf("empty index: Wedged = %v, want an empty list", got)
	}
	idx.Add(gputest.Node("ready", gputest.Plan("535.104.05"), 8, nil))
	idx.Add(gputest.WedgedNode("w2", "GPULost: lost", nil))
	idx.Add(gputest.WedgedNode("w1", "DriverWedged: hung", nil))
	idx.Add(gputest.WedgedNode("down", "DriverWedged: hung", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }))
	idx.Add(gputest.WedgedNode("cordoned", "DriverWedged: hung", func(n *corev1.Node) { n.Spec.Unschedulable = true }))
	if got, want := wedgedNames(idx), []string{"w1=DriverWedged: hung", "w2=GPULost: lost"}; !slices.Equal(got, want) {
		t.Errorf("Wedged = %v, want %v", got, want)
	}
	if g := gputest.MetricValue(t, wedgedNodes); g != 2 {
		t.Errorf("gpu_injector_wedged_nodes = %v, want 2", g)
	}
	if len(idx.Layouts()) != 1 {
		t.Errorf("layouts = %d, want only the ready node's", len(idx.Layouts()))
	}

	before := idx.Wedged()
	idx.Update(gputest.WedgedNode("w1", "DriverWedged: hung", nil))
	if after := idx.Wedged(); &after[0] != &before[0] {
		t.Error("a heartbeat of a wedged node republished the list")
	}
	idx.Update(gputest.WedgedNode("w1", "DriverWedged: still hung", nil))
	if got := wedgedNames(idx); !slices.Equal(got, []string{"w1=DriverWedged: still hung", "w2=GPULost: lost"}) {
		t.Errorf("after a new reason: %v", got)
	}
	idx.Update(gputest.WedgedNode("w2", "GPULost: lost", func(n *corev1.Node) { n.Labels["accelerator"] = "a100" }))
	if w := idx.Wedged()[1]; w.Node.Labels.Map()["accelerator"] != "a100" {
		t.Errorf("a wedged node's new labels are not kept: %v", w.Node.Labels.Map())
	}

	idx.Update(gputest.Node("w1", gputest.Plan("535.104.05"), 8, nil)) // the driver answers again
	idx.Delete("w2")
	if got := idx.Wedged(); len(got) != 0 {
		t.Errorf("after recovery and deletion: Wedged = %v", wedgedNames(idx))
	}
	if g := gputest.MetricValue(t, wedgedNodes); g != 0 {
		t.Errorf("gpu_injector_wedged_nodes = %v, want 0", g)
	}
	if len(idx.Layouts()) != 1 || len(idx.Layouts()[0].Nodes) != 2 {
		t.Errorf("the recovered node is not a candidate again: %v", idx.Layouts())
	}

	// A relist forgets a wedged node that is gone.
	idx.Update(gputest.WedgedNode("w3", "DriverWedged: hung", nil))
	idx.Replace([]*corev1.Node{gputest.Node("ready", gputest.Plan("535.104.05"), 8, nil)})
	if got := idx.Wedged(); len(got) != 0 {
		t.Errorf("after a relist without it: Wedged = %v", wedgedNames(idx))
	}
}

func TestCleanReason(t *testing.T) {
	long := strings.Repeat("x", 400)
	for in, want := range map[string]string{
		"":                               "no reason given",
		"DriverWedged: hung":             "DriverWedged: hung",
		"line\nbreak\tand\x1b[31mcolour": "line break and [31mcolour",
		// At most maxReasonBytes, the cut's "..." included, and never inside a character.
		long:                     strings.Repeat("x", maxReasonBytes-3) + "...",
		strings.Repeat("é", 200): strings.Repeat("é", (maxReasonBytes-3)/2) + "...",
	} {
		if got := cleanReason(in); got != want {
			t.Errorf("cleanReason(%.40q) = %.60q, want %.60q", in, got, want)
		}
	}
}

func rejectedTotal(t *testing.T) float64 {
	var sum float64
	for _, r := range []string{RejectDecode, RejectInvalid, RejectFingerprint} {
		sum += gputest.MetricValue(t, layoutsRejected.WithLabelValues(r))
	}
	return sum
}

func TestIndexRejectsHostileLayouts(t *testing.T) {
	good := gputest.Plan("535.104.05")
	withMount := func(host, container string, kind layout.MountKind) func(*corev1.Node) {
		return func(n *corev1.Node) {
			p := gputest.Plan("535.104.05")
			p.Mounts[0] = layout.Mount{HostPath: host, ContainerPath: container, Kind: kind}
			enc, _ := layout.Encode(p)
			n.Annotations[layout.AnnotationLayout] = enc
			// A hostile node can compute the right fingerprint too.
			n.Labels[layout.LabelFingerprint] = p.Fingerprint()
		}
	}
	lib := "/usr/local/nvidia/lib64"
	cases := map[string]struct {
		mod    func(*corev1.Node)
		reason string
	}{
		"host root":              {withMount("/", lib, layout.KindDirectory), RejectInvalid},
		"host etc":               {withMount("/etc", lib, layout.KindDirectory), RejectInvalid},
		"dot dot":                {withMount("/usr/lib/nvidia-535/../../../etc", lib, layout.KindDirectory), RejectInvalid},
		"relative host path":     {withMount("usr/lib/nvidia-535", lib, layout.KindDirectory), RejectInvalid},
		"shared folder whole":    {withMount("/usr/lib/x86_64-linux-gnu", lib, layout.KindDirectory), RejectInvalid},
		"non-driver shared file": {withMount("/usr/lib/x86_64-linux-gnu/libc.so.6", lib+"/libc.so.6", layout.KindFile), RejectInvalid},
		"container path outside": {withMount("/usr/lib/nvidia-535", "/bin", layout.KindDirectory), RejectInvalid},
		"fingerprint mismatch": {func(n *corev1.Node) {
			n.Labels[layout.LabelFingerprint] = "0000000000deadbeef00"
		}, RejectFingerprint},
		"undecodable json": {func(n *corev1.Node) {
			n.Annotations[layout.AnnotationLayout] = `{"schemaVersion":"v1","mounts":[{"hostPath":"/"`
		}, RejectDecode},
		"unknown field": {func(n *corev1.Node) {
			n.Annotations[layout.AnnotationLayout] = `{"schemaVersion":"v1","driverVersion":"1","mounts":[],"libraryPaths":[],"privileged":true}`
		}, RejectDecode},
		"foreign schema": {func(n *corev1.Node) {
			n.Annotations[layout.AnnotationLayout] = `{"schemaVersion":"v2","driverVersion":"1","mounts":[],"libraryPaths":[]}`
		}, RejectDecode},
		"missing annotation": {func(n *corev1.Node) { delete(n.Annotations, layout.AnnotationLayout) }, RejectDecode},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			idx := NewIndex(config.Default(), logr.Discard())
			idx.Add(gputest.Node("good", good, 8, nil))
			counter := layoutsRejected.WithLabelValues(tc.reason)
			before := gputest.MetricValue(t, counter)
			beforeAll := rejectedTotal(t)

			idx.Add(gputest.Node("bad", good, 100, tc.mod))
			got := idx.Layouts()
			if len(got) != 1 || !slices.Equal(layoutNodeNames(got[0]), []string{"good"}) {
				t.Fatalf("layouts = %v, want only the good node's", got)
			}
			if d := gputest.MetricValue(t, counter) - before; d != 1 {
				t.Errorf("rejected{reason=%s} moved by %v, want 1", tc.reason, d)
			}
			if d := rejectedTotal(t) - beforeAll; d != 1 {
				t.Errorf("all rejected counters moved by %v, want 1", d)
			}

			// A status heartbeat with the same layout is not a new rejection.
			idx.Update(gputest.Node("bad", good, 99, tc.mod))
			if d := gputest.MetricValue(t, counter) - before; d != 1 {
				t.Errorf("after an unchanged update rejected moved by %v in total, want 1", d)
			}

			// The node fixes its layout: it becomes a candidate.
			idx.Update(gputest.Node("bad", good, 100, nil))
			if got := idx.Layouts(); len(got) != 1 || len(got[0].Nodes) != 2 {
				t.Errorf("after the fix layouts = %v, want the good layout with both nodes", got)
			}
			// And breaks it again: a change, so counted again.
			idx.Update(gputest.Node("bad", good, 100, tc.mod))
			if d := gputest.MetricValue(t, counter) - before; d != 2 {
				t.Errorf("after breaking again rejected moved by %v in total, want 2", d)
			}
			if got := idx.Layouts(); len(got) != 1 || len(got[0].Nodes) != 1 {
				t.Errorf("after breaking again layouts = %v, want the good node alone", got)
			}
		})
	}
}

func TestIndexNodeInfo(t *testing.T) {
	// The default names count what NVIDIA's device plugin advertises.
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	idx.Add(gputest.Node("n1", gputest.Plan("535.104.05"), 2, func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{
			{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule},
			{Key: "soft", Effect: corev1.TaintEffectPreferNoSchedule},
			{Key: "evict", Effect: corev1.TaintEffectNoExecute},
		}
		n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		n.Status.Allocatable["nvidia.com/mig-3g.40gb.shared"] = resource.MustParse("4")
		n.Status.Allocatable["nvidia.com/gpu.shared"] = resource.MustParse("8")
		n.Status.Allocatable["example.com/fpga"] = resource.MustParse("5")
		n.Status.Allocatable["nvidia.com/migration"] = resource.MustParse("3")
	}))
	got := idx.Layouts()
	if len(got) != 1 {
		t.Fatalf("got %d layouts", len(got))
	}
	info := got[0].Nodes[0]
	if info.AllocatableGPUs != 21 {
		t.Errorf("allocatable GPUs = %d, want 21 (2 full + 7 MIG + 4 shared MIG + 8 shared, no FPGA or CPU)", info.AllocatableGPUs)
	}
	var effects []corev1.TaintEffect
	for _, tt := range info.Taints {
		effects = append(effects, tt.Effect)
	}
	if want := []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute}; !slices.Equal(effects, want) {
		t.Errorf("taints = %v, want %v", effects, want)
	}
	if info.Labels.Get("kubernetes.io/hostname") != "n1" {
		t.Errorf("labels = %v", info.Labels.Map())
	}

	// A taint change is a change: the published node follows.
	idx.Update(gputest.Node("n1", gputest.Plan("535.104.05"), 2, nil))
	if n := idx.Layouts()[0].Nodes[0]; len(n.Taints) != 0 {
		t.Errorf("after removing taints node info keeps %v", n.Taints)
	}
}

func TestIndexCallerReusesNode(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	n := gputest.Node("n1", gputest.Plan("535.104.05"), 8, nil)
	idx.Add(n)
	n.Labels["zone"] = "a"
	idx.Update(n)
	if got := idx.Layouts()[0].Nodes[0].Labels.Get("zone"); got != "a" {
		t.Fatalf("a label added in place was missed: zone=%q", got)
	}
	n.Labels["zone"] = "b"
	if got := idx.Layouts()[0].Nodes[0].Labels.Get("zone"); got != "a" {
		t.Fatalf("the caller's map leaked into the snapshot: zone=%q", got)
	}
	idx.Update(n)
	if got := idx.Layouts()[0].Nodes[0].Labels.Get("zone"); got != "b" {
		t.Fatalf("a label changed in place was missed: zone=%q", got)
	}
}

func TestIndexTransform(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	p := gputest.Plan("535.104.05")
	n := gputest.Node("n1", p, 8, func(n *corev1.Node) {
		n.Annotations["node.alpha.kubernetes.io/ttl"] = "0"
		n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
		n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
		n.Spec.PodCIDR, n.Spec.PodCIDRs, n.Spec.ProviderID = "10.0.0.0/24", []string{"10.0.0.0/24"}, "aws:///i-1"
		n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}
		n.Status.Images = []corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/cuda:12.4"}, SizeBytes: 1 << 30}}
		n.Status.Capacity = n.Status.Allocatable
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}
		n.Status.Conditions = append([]corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}}, n.Status.Conditions...)
		n.Status.Conditions[1].Message = "kubelet is posting ready status"
	})
	full := n.DeepCopy()
	out, err := idx.Transform(n)
	if err != nil {
		t.Fatal(err)
	}
	sn := out.(*streamedNode)
	if !reflect.DeepEqual(n, full) {
		t.Errorf("transform changed the Node")
	}
	if sn.info.Name != "n1" || !sn.info.Labels.SameAs(full.Labels) {
		t.Errorf("interned labels = %v, want every label of the node %v", sn.info.Labels.Map(), full.Labels)
	}
	if sn.source.annotation.Value() != full.Annotations[layout.AnnotationLayout] || !sn.hasLayout || sn.source.label != p.Fingerprint() {
		t.Errorf("layout source = %+v, want the node's annotation and label", sn.source)
	}
	if sn.state != layout.StateReady || !sn.ready || sn.unschedulable || sn.own != 8 || sn.info.AllocatableGPUs != 8 {
		t.Errorf("facts = %+v, want a ready node of 8 GPUs", sn.nodeFacts)
	}
	if len(sn.info.Taints) != 1 {
		t.Errorf("taints = %v", sn.info.Taints)
	}
	if m := sn.GetObjectMeta(); m.GetName() != "n1" || m.GetResourceVersion() != full.ResourceVersion || m.GetUID() != full.UID {
		t.Errorf("metadata = %+v, want the Node's name, UID and resourceVersion", m)
	}
	if err := NewNodeStore(idx).Add(sn); err != nil {
		t.Fatal(err)
	}
	got := idx.Layouts()
	if len(got) != 1 || got[0].AllocatableGPUs != 8 {
		t.Fatalf("the stripped node is no longer a candidate: %v", got)
	}
	if l := got[0].Nodes[0].Labels; !l.SameAs(full.Labels) {
		t.Errorf("the index keeps labels %v, want the node's %v", l.Map(), full.Labels)
	}
	// A heartbeat of the full Node afterwards changes nothing kept.
	idx.Update(full)
	if again := idx.Layouts(); len(again) != 1 || again[0].Nodes[0] != got[0].Nodes[0] {
		t.Errorf("a heartbeat after the streamed node republished it")
	}
	// A pool's keys stay in the map: the index reads them by key.
	pcfg := config.Default()
	pcfg.Pinning.NodeLabels = []string{"karpenter.sh/nodepool"}
	pn := gputest.Node("n2", p, 8, func(n *corev1.Node) { n.Labels["karpenter.sh/nodepool"] = "gpu" })
	pout, _ := NewIndex(pcfg, logr.Discard()).Transform(pn)
	if got := pout.(*streamedNode).info.Pool; got != "karpenter.sh/nodepool=gpu" {
		t.Errorf("pool with pinning by pool = %q, want the pool key", got)
	}
	// Other objects pass through untouched.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", ManagedFields: []metav1.ManagedFieldsEntry{{}}}}
	if out, _ := idx.Transform(ns); out.(*corev1.Namespace).ManagedFields == nil {
		t.Errorf("transform changed a Namespace")
	}
}

func TestIndexReady(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	if idx.Ready() || idx.ReadyCheck(nil) == nil {
		t.Fatal("a new index without a list reports ready")
	}
	p := gputest.Plan("535.104.05")
	if err := NewNodeStore(idx).Add(gputest.Node("n1", p, 8, nil)); err != nil {
		t.Fatal(err)
	}
	if idx.Ready() {
		t.Fatal("ready after a watch event, before the first list")
	}
	if err := NewNodeStore(idx).Replace([]any{gputest.Node("n2", p, 8, nil)}, "1"); err != nil {
		t.Fatal(err)
	}
	if !idx.Ready() || idx.ReadyCheck(nil) != nil {
		t.Fatal("not ready after the first list")
	}
	// The list is the whole truth: n1 was deleted while the watch was down.
	if got := idx.nodeNames(); !slices.Equal(got, []string{"n2"}) {
		t.Errorf("nodes after the list = %v, want [n2]", got)
	}
}

// TestIndexReplaceLikeUpdates: a list recorded at once gives the layouts
// that recording its Nodes one by one gives, and leaves the snapshots
// published before it unchanged.
func TestIndexReplaceLikeUpdates(t *testing.T) {
	plans := []layout.Plan{gputest.Plan("535.104.05"), gputest.Plan("550.54.15"), gputest.Plan("570.86.10")}
	list := func(round int) []*corev1.Node {
		var out []*corev1.Node
		for i := range 60 {
			if (i+round)%9 == 0 {
				continue // not in this list: deleted
			}
			out = append(out, gputest.Node(fmt.Sprintf("n%02d", i), plans[(i+round)%3], int64(1+(i*round)%8), func(n *corev1.Node) {
				if (i+round)%7 == 0 {
					n.Status.Conditions[0].Status = corev1.ConditionFalse
				}
			}))
		}
		return out
	}
	batched, oneByOne := NewIndex(config.Default(), logr.Discard()), NewIndex(config.Default(), logr.Discard())
	var before []*inject.Layout
	var beforeNodes [][]string
	for round := range 4 {
		nodes := list(round)
		batched.Replace(nodes)
		seen := map[string]bool{}
		for _, n := range nodes {
			oneByOne.Update(n)
			seen[n.Name] = true
		}
		for _, name := range oneByOne.nodeNames() {
			if !seen[name] {
				oneByOne.Delete(name)
			}
		}
		describe := func(ls []*inject.Layout) string {
			var b strings.Builder
			for _, l := range ls {
				fmt.Fprintf(&b, "%s gpus=%d:", l.Fingerprint, l.AllocatableGPUs)
				for _, n := range l.Nodes {
					fmt.Fprintf(&b, " %s/%d", n.Name, n.AllocatableGPUs)
				}
				b.WriteString("\n")
			}
			return b.String()
		}
		if got, want := describe(batched.Layouts()), describe(oneByOne.Layouts()); got != want {
			t.Fatalf("round %d: Replace gives\n%s\nUpdate one by one gives\n%s", round, got, want)
		}
		for i, l := range before {
			var names []string
			for _, n := range l.Nodes {
				names = append(names, n.Name)
			}
			if !slices.Equal(names, beforeNodes[i]) {
				t.Fatalf("round %d changed a published layout's nodes: %v, was %v", round, names, beforeNodes[i])
			}
		}
		before, beforeNodes = batched.Layouts(), nil
		for _, l := range before {
			var names []string
			for _, n := range l.Nodes {
				names = append(names, n.Name)
			}
			beforeNodes = append(beforeNodes, names)
		}
	}
}

// TestIndexWatch runs the index as a reflector's store against a scripted
// list and watch: the first list makes it ready, watch events change it, and
// a relist after the watch expires forgets the nodes deleted meanwhile.
func TestIndexWatch(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	a, b := gputest.Plan("535.104.05"), gputest.Plan("550.54.15")
	var mu sync.Mutex
	lists := [][]corev1.Node{
		{*gputest.Node("n1", a, 8, nil), *gputest.Node("n2", a, 8, nil)},
		{*gputest.Node("n3", b, 4, nil)},
	}
	watches := make(chan *watch.FakeWatcher, 2)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			items := lists[0]
			if len(lists) > 1 {
				lists = lists[1:]
			}
			return &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: items}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFake()
			watches <- w
			return w, nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		idx.Watch(ctx, toolscache.ToListWatcherWithWatchListSemantics(lw, noWatchList{}))
	}()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; nodes %v", what, idx.nodeNames())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	w := <-watches
	waitFor("the first list", func() bool { return idx.Ready() && len(idx.nodeNames()) == 2 })
	n1 := gputest.Node("n1", a, 2, nil)
	n1.ResourceVersion = "11"
	w.Modify(n1)
	waitFor("the update", func() bool { ls := idx.Layouts(); return len(ls) == 1 && ls[0].AllocatableGPUs == 10 })
	w.Delete(gputest.Node("n2", a, 8, nil))
	waitFor("the delete", func() bool { return slices.Equal(idx.nodeNames(), []string{"n1"}) })
	// The API server compacted past the watch's resource version: the
	// reflector lists again, and n1 was deleted meanwhile.
	w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	<-watches
	waitFor("the relist", func() bool { return slices.Equal(idx.nodeNames(), []string{"n3"}) })
	if ls := idx.Layouts(); len(ls) != 1 || ls[0].Fingerprint != b.Fingerprint() {
		t.Errorf("layouts after the relist = %v, want %s alone", ls, b.Fingerprint())
	}
}

// TestIndexWatchListStream: where the API server streams the first list as
// watch events ending in a bookmark (client-go's default since 1.35), the
// index is ready once the stream ends, with every streamed Node.
func TestIndexWatchListStream(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	p := gputest.Plan("535.104.05")
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			t.Error("the reflector listed instead of streaming")
			return &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFakeWithChanSize(4, false)
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				for _, name := range []string{"n1", "n2"} {
					w.Add(gputest.Node(name, p, 8, func(n *corev1.Node) {
						n.ResourceVersion = "5"
						n.Status.Images = []corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/cuda:12.4"}, SizeBytes: 1 << 30}}
					}))
				}
				w.Action(watch.Bookmark, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "10",
					Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			}
			return w, nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); idx.Watch(ctx, lw) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for !idx.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("not ready after the streamed list")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := idx.nodeNames(); len(got) != 2 {
		t.Errorf("nodes after the streamed list = %v, want n1 and n2", got)
	}
	if ls := idx.Layouts(); len(ls) != 1 || ls[0].AllocatableGPUs != 16 {
		t.Errorf("layouts after the streamed list = %v", ls)
	}
}

// noWatchList makes a reflector list, then watch: the scripted list and
// watch above do not stream a list as an API server does.
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// TestIndexConcurrentReaders reads snapshots while events change the index;
// run with -race, it proves readers need no lock and see no torn state.
func TestIndexConcurrentReaders(t *testing.T) {
	plans := []layout.Plan{gputest.Plan("535.104.05"), gputest.Plan("550.54.15")}
	idx := NewIndex(config.Default(), logr.Discard())
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for r := 0; r < 4; r++ {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				for _, l := range idx.Layouts() {
					var sum int64
					for _, n := range l.Nodes {
						sum += n.AllocatableGPUs
						_ = n.Labels.Get("kubernetes.io/hostname")
					}
					if sum != l.AllocatableGPUs || len(l.Nodes) == 0 {
						errs <- fmt.Errorf("layout %s: %d nodes sum to %d GPUs, layout says %d", l.Fingerprint, len(l.Nodes), sum, l.AllocatableGPUs)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		name := fmt.Sprintf("n%02d", i%37)
		switch {
		case i%7 == 0:
			idx.Delete(name)
			continue
		case i%101 == 0:
			// A relist: changes in place the node lists it made itself.
			var list []*corev1.Node
			for j := range i % 23 {
				list = append(list, gputest.Node(fmt.Sprintf("n%02d", j), plans[j%2], int64(j%3), nil))
			}
			idx.Replace(list)
			continue
		}
		idx.Update(gputest.Node(name, plans[i%2], int64(i%5), nil))
	}
	close(stop)
	for r := 0; r < 4; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestIndexManyNodes checks the incremental bookkeeping against a rebuild
// from scratch after a random-looking sequence of events.
func TestIndexManyNodes(t *testing.T) {
	plans := []layout.Plan{gputest.Plan("470.256.02"), gputest.Plan("535.104.05"), gputest.Plan("550.54.15")}
	idx := NewIndex(config.Default(), logr.Discard())
	final := map[string]*corev1.Node{}
	for step := 0; step < 3000; step++ {
		name := fmt.Sprintf("n%03d", (step*7919)%211)
		switch step % 5 {
		case 4:
			idx.Delete(name)
			delete(final, name)
		default:
			n := gputest.Node(name, plans[(step/3)%3], int64(step%9), nil)
			if step%11 == 0 {
				n.Spec.Unschedulable = true
			}
			idx.Update(n)
			final[name] = n
		}
	}
	fresh := NewIndex(config.Default(), logr.Discard())
	for _, n := range final {
		fresh.Add(n)
	}
	got, want := idx.Layouts(), fresh.Layouts()
	if len(got) != len(want) {
		t.Fatalf("incremental has %d layouts, rebuild %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Fingerprint != want[i].Fingerprint || got[i].AllocatableGPUs != want[i].AllocatableGPUs ||
			!slices.Equal(layoutNodeNames(got[i]), layoutNodeNames(want[i])) {
			t.Errorf("layout %d: incremental %s/%d/%v, rebuild %s/%d/%v", i,
				got[i].Fingerprint, got[i].AllocatableGPUs, layoutNodeNames(got[i]),
				want[i].Fingerprint, want[i].AllocatableGPUs, layoutNodeNames(want[i]))
		}
	}
}

// TestIndexCapsNodeGPUs: a node reporting absurd capacity counts for
// MaxNodeGPUs, and a total cannot overflow.
func TestIndexCapsNodeGPUs(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	p := gputest.Plan("535.104.05")
	idx.Add(gputest.Node("liar", p, 9223372036854775807, nil))
	idx.Add(gputest.Node("liar-2", p, 1000000, nil))
	ls := idx.Layouts()
	if len(ls) != 1 {
		t.Fatalf("got %d layouts", len(ls))
	}
	if got := ls[0].AllocatableGPUs; got != 2*MaxNodeGPUs {
		t.Errorf("AllocatableGPUs = %d, want %d", got, 2*MaxNodeGPUs)
	}
}

// TestIndexSharesLabelsAndLayout: nodes of one pool publish the same layout
// annotation and mostly the same labels; the index keeps one copy of each,
// however many copies the decoded Nodes carried.
func TestIndexSharesLabelsAndLayout(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	p := gputest.Plan("535.104.05")
	own := func(n *corev1.Node) {
		// As decoded from the API server: every string a copy of its own.
		for k, v := range n.Labels {
			n.Labels[k] = strings.Clone(v)
		}
		n.Annotations[layout.AnnotationLayout] = strings.Clone(n.Annotations[layout.AnnotationLayout])
	}
	idx.Add(gputest.Node("a", p, 8, own))
	idx.Add(gputest.Node("b", p, 8, own))
	if len(idx.Layouts()) != 1 || len(idx.Layouts()[0].Nodes) != 2 {
		t.Fatalf("layouts = %+v", idx.Layouts())
	}
	na, nb := idx.nodes["a"], idx.nodes["b"]
	if na.source.annotation != nb.source.annotation {
		t.Errorf("the layout annotation is kept twice")
	}
	// Interned, the two nodes' values are one string in memory, though each
	// Node brought a copy of its own.
	if a, b := na.info.Labels.Get(layout.LabelFingerprint), nb.info.Labels.Get(layout.LabelFingerprint); a != b || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Errorf("a label is kept twice")
	}
	if na.info.Labels.Get(corev1.LabelHostname) != "a" || nb.info.Labels.Get(corev1.LabelHostname) != "b" {
		t.Errorf("hostnames mixed up: %v %v", na.info.Labels.Map(), nb.info.Labels.Map())
	}
}

// TestIndexStreamedRelistLikeWholeNodes: a relist streamed through
// Transform (a watch-list after the watch expired) in which one node's
// labels changed, as GPU feature discovery relabels a node after a driver
// upgrade, and another moved to another pool, leaves the index as the same
// Nodes recorded whole would: the changed labels and pools are seen.
func TestIndexStreamedRelistLikeWholeNodes(t *testing.T) {
	cfg := config.Default()
	cfg.Pinning.NodeLabels = []string{"karpenter.sh/nodepool"}
	p := gputest.Plan("535.104.05")
	node := func(name, pool, cuda string) *corev1.Node {
		return gputest.Node(name, p, 8, func(n *corev1.Node) {
			n.Labels["karpenter.sh/nodepool"] = pool
			n.Labels["nvidia.com/cuda.driver.major"] = cuda
		})
	}
	first := []*corev1.Node{node("n1", "a", "12"), node("n2", "a", "12"), node("n3", "b", "12")}
	relist := []*corev1.Node{node("n1", "a", "13"), node("n2", "b", "12"), node("n3", "b", "12")}
	stream := func(idx *Index, nodes []*corev1.Node) {
		t.Helper()
		list := make([]any, len(nodes))
		for i, n := range nodes {
			var err error
			if list[i], err = idx.Transform(n.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
		if err := NewNodeStore(idx).Replace(list, ""); err != nil {
			t.Fatal(err)
		}
	}
	streamed, whole := NewIndex(cfg, logr.Discard()), NewIndex(cfg, logr.Discard())
	stream(streamed, first)
	whole.Replace(first)
	stream(streamed, relist)
	whole.Replace(relist)
	describe := func(idx *Index) string {
		var b strings.Builder
		for _, l := range idx.Layouts() {
			for _, n := range l.Nodes {
				fmt.Fprintf(&b, "%s pool=%s %v\n", n.Name, n.Pool, n.Labels.Map())
			}
		}
		return b.String()
	}
	got, want := describe(streamed), describe(whole)
	if got != want {
		t.Fatalf("streamed relist gives\n%s\nwhole Nodes give\n%s", got, want)
	}
	for _, want := range []string{"n1 pool=karpenter.sh/nodepool=a", "nvidia.com/cuda.driver.major:13", "n2 pool=karpenter.sh/nodepool=b"} {
		if !strings.Contains(got, want) {
			t.Errorf("index after the relist:\n%s\nwant %q", got, want)
		}
	}
}

// gpuNames lists a node's GPU resources as "name=count", the DRA entry as
// "dra=count".
func gpuNames(n *inject.NodeInfo) []string {
	var out []string
	for name, c := range n.GPUs.All() {
		if name == inject.DRAResource {
			name = "dra"
		}
		out = append(out, fmt.Sprintf("%s=%d", name, c))
	}
	return out
}

// TestIndexGPUResourceNames: the index keeps which GPU resources each node
// offers, follows its allocatable and DRA's count, shares one copy between
// nodes that offer the same, and keeps it through a heartbeat.
func TestIndexGPUResourceNames(t *testing.T) {
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	plan := gputest.Plan("535.104.05")
	mig := func(n *corev1.Node) {
		delete(n.Status.Allocatable, "nvidia.com/gpu")
		n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		n.Status.Allocatable["nvidia.com/mig-3g.40gb"] = resource.MustParse("0")
		n.Status.Allocatable["example.com/fpga"] = resource.MustParse("2")
	}
	idx.Update(gputest.Node("a", plan, 8, nil))
	idx.Update(gputest.Node("b", plan, 8, nil))
	idx.Update(gputest.Node("c", plan, 0, mig))
	node := func(name string) *inject.NodeInfo {
		t.Helper()
		for _, n := range idx.Layouts()[0].Nodes {
			if n.Name == name {
				return n
			}
		}
		t.Fatalf("node %s not in the layout", name)
		return nil
	}
	if got := gpuNames(node("a")); !slices.Equal(got, []string{"nvidia.com/gpu=8"}) {
		t.Errorf("a offers %v", got)
	}
	if got := gpuNames(node("c")); !slices.Equal(got, []string{"nvidia.com/mig-1g.10gb=7"}) {
		t.Errorf("c offers %v, want only its MIG devices above 0 (no FPGA)", got)
	}
	if node("a").GPUs != node("b").GPUs {
		t.Errorf("nodes offering the same GPUs hold two copies")
	}
	if got := idx.Layouts()[0].Offered(); !maps.Equal(got, map[string]int64{"nvidia.com/gpu": 16, "nvidia.com/mig-1g.10gb": 7}) {
		t.Errorf("layout offers %v", got)
	}

	// A heartbeat keeps the published node.
	before := node("c")
	idx.Update(gputest.Node("c", plan, 0, mig))
	if node("c") != before {
		t.Errorf("a heartbeat replaced the node")
	}

	// The device plugin reconfigured: MIG off, whole GPUs and shared ones.
	idx.Update(gputest.Node("c", plan, 2, func(n *corev1.Node) {
		n.Status.Allocatable["nvidia.com/gpu.shared"] = resource.MustParse("8")
	}))
	if got := gpuNames(node("c")); !slices.Equal(got, []string{"nvidia.com/gpu=2", "nvidia.com/gpu.shared=8"}) {
		t.Errorf("after the change c offers %v", got)
	}
	if got := before.GPUs.Has("nvidia.com/mig-1g.10gb"); !got {
		t.Errorf("the published node changed under a reader")
	}
	if got := idx.Layouts()[0].Offered(); !maps.Equal(got, map[string]int64{"nvidia.com/gpu": 18, "nvidia.com/gpu.shared": 8}) {
		t.Errorf("layout offers %v after the change", got)
	}

	// DRA's GPUs come and go as their own entry; the allocatable's stay.
	idx.SetDRAGPUs("a", 4)
	if got := gpuNames(node("a")); !slices.Equal(got, []string{"dra=4", "nvidia.com/gpu=8"}) {
		t.Errorf("with DRA a offers %v", got)
	}
	idx.Update(gputest.Node("a", plan, 6, nil))
	if got := gpuNames(node("a")); !slices.Equal(got, []string{"dra=4", "nvidia.com/gpu=6"}) {
		t.Errorf("with DRA, after an allocatable change a offers %v", got)
	}
	idx.SetDRAGPUs("a", 0)
	if got := gpuNames(node("a")); !slices.Equal(got, []string{"nvidia.com/gpu=6"}) {
		t.Errorf("without DRA a offers %v", got)
	}

	// No GPU left at all: the empty set.
	idx.Update(gputest.Node("b", plan, 0, nil))
	if got := gpuNames(node("b")); len(got) != 0 || node("b").GPUs != (inject.GPUResources{}) {
		t.Errorf("b with no GPU offers %v", got)
	}
}

// TestChooseByRequestedResource: a layout is a candidate only where a node
// offers every GPU resource the pod requests; one whose GPUs come through
// DRA offers the names GPU DeviceClasses serve; a remembered pool layout
// stays a candidate, as its memory records no resources.
func TestChooseByRequestedResource(t *testing.T) {
	cfg := config.Default()
	// hostPath only: the test is of the layout a pod is given.
	cfg.DriverDelivery = config.DeliveryHostPath
	whole, migPlan, draPlan := gputest.Plan("535.104.05"), gputest.Plan("550.54.15"), gputest.Plan("580.95.05")
	nodes := []corev1.Node{
		*gputest.Node("whole-1", whole, 8, nil),
		*gputest.Node("whole-2", whole, 8, nil),
		// One GPU of this node is partitioned: the layout offers MIG devices too.
		*gputest.Node("whole-mig", whole, 7, func(n *corev1.Node) {
			n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		}),
		*gputest.Node("mig-1", migPlan, 0, func(n *corev1.Node) {
			n.Labels["zone"] = "b"
			n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		}),
		// Two nodes: a layout one node publishes is preferred over no
		// established one (config ranking.minNodes).
		*gputest.Node("mig-2", migPlan, 0, func(n *corev1.Node) {
			n.Labels["zone"] = "b"
			n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		}),
		*gputest.Node("dra-1", draPlan, 0, nil),
	}
	idx := NewIndex(cfg, logr.Discard())
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	idx.SetDRAGPUs("dra-1", 2)
	layouts := idx.Layouts()
	served := []string{"deviceclass.resource.kubernetes.io/gpu.nvidia.com", "nvidia.com/gpu"}
	tests := map[string]struct {
		resource string
		mod      func(*corev1.Pod)
		dra      []string
		want     string
		why      string
	}{
		"whole GPU":                {resource: "nvidia.com/gpu", want: whole.Fingerprint()},
		"MIG":                      {resource: "nvidia.com/mig-1g.10gb", want: migPlan.Fingerprint()},
		"whole GPU, DRA serves it": {resource: "nvidia.com/gpu", dra: served, want: whole.Fingerprint()},
		"DRA class":                {resource: "deviceclass.resource.kubernetes.io/gpu.nvidia.com", dra: served, want: draPlan.Fingerprint()},
		"DRA class on a node without DRA": {
			resource: "deviceclass.resource.kubernetes.io/gpu.nvidia.com", dra: served,
			mod: func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "whole-1"} },
			why: "no node offers deviceclass.resource.kubernetes.io/gpu.nvidia.com",
		},
		"MIG where the selected node lacks it": {
			resource: "nvidia.com/mig-1g.10gb",
			mod:      func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "whole-2"} },
			why:      "layout " + whole.Fingerprint() + " (driver 535.104.05, 3 nodes): no node the pod may land on offers nvidia.com/mig-1g.10gb",
		},
		"MIG on a selected node that lacks it": {
			resource: "nvidia.com/mig-1g.10gb",
			mod:      func(p *corev1.Pod) { p.Spec.NodeName = "whole-1" },
			why:      "pod is bound to node \"whole-1\"",
		},
		"two names only one node offers": {
			resource: "nvidia.com/mig-1g.10gb",
			mod: func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}
			},
			want: whole.Fingerprint(),
		},
		"a profile no node offers": {resource: "nvidia.com/mig-3g.40gb", why: "no node offers nvidia.com/mig-3g.40gb"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := gputest.Pod(tc.resource, func(p *corev1.Pod) {
				p.Namespace = "ml"
				if tc.mod != nil {
					tc.mod(p)
				}
			})
			res := inject.Mutate(inject.Input{Pod: pod, Layouts: layouts, GPUResources: tc.dra}, cfg)
			if tc.want != "" {
				if res.Decision != inject.DecisionInjected || res.Layout.Fingerprint != tc.want {
					t.Fatalf("got %s %v: %s, want layout %s", res.Decision, res.Layout, res.Reason, tc.want)
				}
				return
			}
			if res.Decision != inject.DecisionDenied || !strings.Contains(res.Reason, tc.why) {
				t.Errorf("got %s:\n%s\nwant a denial that says\n%s", res.Decision, res.Reason, tc.why)
			}
		})
	}

	// A pool at zero, remembered: its stand-in node lists no resources.
	cfg = config.Default()
	cfg.Pinning.NodeLabels = []string{"pool"}
	idx = NewIndex(cfg, logr.Discard())
	seen := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	idx.SetClock(clocktesting.NewFakePassiveClock(seen.Add(time.Hour)))
	idx.SetMemory([]pools.Memory{{Pool: "pool=mig", Labels: map[string]string{"pool": "mig"}, NodeLabels: map[string]string{"pool": "mig"}, Plan: migPlan, LastSeen: seen}})
	res := inject.Mutate(inject.Input{Pod: gputest.Pod("nvidia.com/mig-1g.10gb", func(p *corev1.Pod) { p.Namespace = "ml" }), Layouts: idx.Layouts()}, cfg)
	if res.Decision != inject.DecisionInjected || res.Layout.Remembered == nil {
		t.Errorf("remembered MIG pool: got %s: %s", res.Decision, res.Reason)
	}
}

// TestNodeWithoutGPUsYetStaysCandidate: the probe may publish a node's layout
// before its device plugin registers (a node just up, the GPU operator still
// starting). Such a node offers no GPU resource yet, and must not make GPU
// pods be denied: they are pinned and wait Pending for the plugin, as they did
// before resources were checked. A node that offers other GPU names is still
// held to them.
func TestNodeWithoutGPUsYetStaysCandidate(t *testing.T) {
	cfg := config.Default()
	fresh, mig := gputest.Plan("535.104.05"), gputest.Plan("550.54.15")
	nodes := []corev1.Node{
		*gputest.Node("fresh-1", fresh, 0, nil),
		*gputest.Node("mig-1", mig, 0, func(n *corev1.Node) {
			n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
		}),
	}
	idx := NewIndex(cfg, logr.Discard())
	for i := range nodes {
		idx.Update(&nodes[i])
	}
	for name, tc := range map[string]struct{ resource, want string }{
		"whole GPU: only the fresh node may offer it": {"nvidia.com/gpu", fresh.Fingerprint()},
		"MIG: the node that offers it":                {"nvidia.com/mig-1g.10gb", mig.Fingerprint()},
	} {
		t.Run(name, func(t *testing.T) {
			res := inject.Mutate(inject.Input{Pod: gputest.Pod(tc.resource, func(p *corev1.Pod) { p.Namespace = "ml" }), Layouts: idx.Layouts()}, cfg)
			if res.Decision != inject.DecisionInjected || res.Layout.Fingerprint != tc.want {
				t.Fatalf("got %s %v: %s, want layout %s", res.Decision, res.Layout, res.Reason, tc.want)
			}
		})
	}
}
