package gpunodes

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// FuzzNodeLayout fuzzes what the webhook reads from a Node, which the node
// (or anyone who may write Nodes) controls: the layout annotation, the
// fingerprint and state labels, a label of its own, and the allocatable GPU
// count. The index must admit only layouts that validate and match their
// fingerprint, count GPUs within bounds, read the same from what its
// transform made of a streamed Node, and any pod injected from what it admitted must get
// read-only hostPaths inside the allowlist.
func FuzzNodeLayout(f *testing.F) {
	byFP := config.Default()
	// With pinning by pool, the fuzzed node may join, split or mix the good
	// node's pool.
	byPool, err := config.Parse([]byte("pinning: {nodeLabels: [pool]}\n"))
	if err != nil {
		f.Fatal(err)
	}
	rules := byFP.Rules()
	good := gputest.Node("gpu-good", gputest.Plan("535.104.05"), 4, func(n *corev1.Node) { n.Labels["pool"] = "a" })
	pods := [][]byte{}
	for _, gpu := range []string{"nvidia.com/gpu", "alpha.kubernetes.io/nvidia-gpu"} {
		j, err := json.Marshal(gputest.Pod(gpu, nil))
		if err != nil {
			f.Fatal(err)
		}
		pods = append(pods, j)
	}
	pinned, err := json.Marshal(gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.NodeName = "fuzzed" }))
	if err != nil {
		f.Fatal(err)
	}
	pods = append(pods, pinned)

	nodes := gputest.LoadNodes(f, filepath.Join("..", "inject", "testdata", "nodes.yaml"))
	nodes = append(nodes, gputest.LoadNodes(f, filepath.Join("..", "inject", "testdata", "nodes-hostile.yaml"))...)
	for i, n := range nodes {
		q := n.Status.Allocatable["nvidia.com/gpu"]
		f.Add(n.Annotations[layout.AnnotationLayout], n.Labels[layout.LabelFingerprint], n.Labels[layout.LabelState], q.String(), "accelerator=nvidia-tesla-k80", uint8(i))
		f.Add(n.Annotations[layout.AnnotationLayout], n.Labels[layout.LabelFingerprint], n.Labels[layout.LabelState], q.String(), "pool=a", uint8(i|4))
	}
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","runtimeInjection":"cdi"}`, "", layout.StateReady, "1", "", uint8(0))
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","mounts":[],"libraryPaths":[],"runtimeInjection":"device-plugin"}`, "", layout.StateReady, "1", "", uint8(0))
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/lib/nvidia-1/../../../etc","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}]}`, "x", layout.StateReady, "9223372036854775807", "", uint8(1))

	f.Fuzz(func(t *testing.T, ann, fp, state, gpus, label string, sel uint8) {
		cfg := byFP
		if sel&4 != 0 {
			cfg = byPool
		}
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        "fuzzed",
				Labels:      map[string]string{layout.LabelState: state, layout.LabelFingerprint: fp},
				Annotations: map[string]string{layout.AnnotationLayout: ann},
			},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
		if k, v, ok := strings.Cut(label, "="); ok {
			n.Labels[k] = v
		}
		// apimachinery v0.36's ParseQuantity takes time and memory
		// exponential in a decimal exponent's digits, and does not return on
		// one beyond int32 ("92E3372036854775807": it wraps, then rounds a
		// number of a billion digits; fixed upstream after v0.36). The API
		// server decodes a Node's allocatable with that parser before any
		// informer sees it, so such a count never reaches the index; it
		// would only stall this target. Two exponent digits are kept.
		if i := strings.IndexAny(gpus, "eE"); i >= 0 && len(gpus)-i > 4 {
			gpus = ""
		}
		if q, err := resource.ParseQuantity(gpus); err == nil {
			n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": q}
		}
		if sel&1 != 0 {
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
		}

		idx := NewIndex(cfg, logr.Discard())
		idx.Update(good)
		idx.Update(n.DeepCopy())
		layouts := idx.Layouts()
		var fuzzedIn *inject.Layout
		for _, l := range layouts {
			if l.Fingerprint != l.Plan.Fingerprint() {
				t.Fatalf("layout %s admitted under a fingerprint that is not its plan's (%s)", l.Fingerprint, l.Plan.Fingerprint())
			}
			if errs := l.Plan.Validate(rules); len(errs) > 0 {
				t.Fatalf("layout %s admitted with errors: %v", l.Fingerprint, errs.ToAggregate())
			}
			gputest.CheckPlanSafe(t, l.Plan, cfg)
			if l.AllocatableGPUs < 0 || l.AllocatableGPUs > int64(len(l.Nodes))*MaxNodeGPUs {
				t.Fatalf("layout %s counts %d GPUs on %d nodes", l.Fingerprint, l.AllocatableGPUs, len(l.Nodes))
			}
			for _, ni := range l.Nodes {
				if ni.Name == "fuzzed" {
					fuzzedIn = l
				}
			}
		}
		if fuzzedIn != nil {
			if state != layout.StateReady || fuzzedIn.Fingerprint != fp {
				t.Fatalf("node with state %q and fingerprint label %q admitted under %s", state, fp, fuzzedIn.Fingerprint)
			}
			again, err := layout.Encode(fuzzedIn.Plan)
			if err != nil {
				t.Fatalf("failed to re-encode an admitted plan: %v", err)
			}
			if p, err := layout.Decode(again); err != nil || p.Fingerprint() != fp {
				t.Fatalf("an admitted plan does not survive a round trip: %v", err)
			}
		}

		// A streamed list hands the index nodes after Transform: it must
		// keep all the index reads.
		stripped, err := idx.Transform(n.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		idx2 := NewIndex(cfg, logr.Discard())
		idx2.Update(good)
		if err := NewNodeStore(idx2).Update(stripped); err != nil {
			t.Fatal(err)
		}
		if a, b := layoutSummary(layouts), layoutSummary(idx2.Layouts()); a != b {
			t.Fatalf("the transform changes what the index reads:\n%s\nvs\n%s", a, b)
		}
		// The same node again (a heartbeat) changes nothing; deleting it
		// leaves the good node's layout alone.
		idx.Update(n.DeepCopy())
		if a, b := layoutSummary(layouts), layoutSummary(idx.Layouts()); a != b {
			t.Fatalf("an unchanged node changed the index:\n%s\nvs\n%s", a, b)
		}
		idx.Delete("fuzzed")
		if got := idx.Layouts(); len(got) != 1 || len(got[0].Nodes) != 1 || got[0].Nodes[0].Name != "gpu-good" {
			t.Fatalf("after the fuzzed node is deleted: %s", layoutSummary(got))
		}

		var pod corev1.Pod
		if err := json.Unmarshal(pods[int(sel/8)%len(pods)], &pod); err != nil {
			t.Fatal(err)
		}
		gputest.CheckMutation(t, &pod, nil, layouts, cfg)
	})
}

func layoutSummary(ls []*inject.Layout) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Fingerprint)
		for _, n := range l.Nodes {
			b.WriteString(" " + n.Name + "{")
			for k, v := range n.Labels.All() {
				b.WriteString(k + "=" + v + ",")
			}
			b.WriteString("}")
		}
		b.WriteString(" gpus=" + resource.NewQuantity(l.AllocatableGPUs, resource.DecimalSI).String() + "\n")
	}
	return b.String()
}
