package inject

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
)

func TestLabels(t *testing.T) {
	m := map[string]string{"zone": "a", "kubernetes.io/hostname": "n1", "empty": "", "nvidia.com/gpu.product": "H100"}
	l := NewLabels(m)
	m["zone"] = "changed"
	if got := l.Get("zone"); got != "a" {
		t.Errorf("zone = %q: the labels follow the caller's map", got)
	}
	m["zone"] = "a"
	if v, ok := l.Lookup("empty"); !ok || v != "" {
		t.Errorf(`Lookup("empty") = %q, %v`, v, ok)
	}
	if l.Has("missing") || l.Get("missing") != "" || l.Len() != 4 {
		t.Errorf("missing label found, or Len %d", l.Len())
	}
	if !maps.Equal(l.Map(), m) {
		t.Errorf("Map() = %v, want %v", l.Map(), m)
	}
	var keys []string
	for k := range l.All() {
		keys = append(keys, k)
	}
	if want := []string{"empty", "kubernetes.io/hostname", "nvidia.com/gpu.product", "zone"}; !slices.Equal(keys, want) {
		t.Errorf("All() keys = %v, want %v (sorted)", keys, want)
	}
	if !l.Equal(NewLabels(maps.Clone(m))) || l.Equal(NewLabels(map[string]string{"zone": "a"})) || !(Labels{}).Equal(NewLabels(nil)) {
		t.Errorf("Equal disagrees with the labels' contents")
	}
	if !l.SameAs(m) || l.SameAs(map[string]string{"zone": "a"}) {
		t.Errorf("sameAs disagrees with the labels' contents")
	}
	m["zone"] = "b"
	if l.SameAs(m) {
		t.Errorf("sameAs missed a changed value")
	}
	delete(m, "zone")
	m["zone2"] = "a"
	if l.SameAs(m) {
		t.Errorf("sameAs missed a renamed key")
	}
	// Across chunks: every key found, and none of the keys between them.
	many := map[string]string{}
	for i := range 3*labelChunkLen + 3 {
		many[fmt.Sprintf("k%03d", 2*i)] = fmt.Sprint(i)
	}
	ml := NewLabels(many)
	for i := -1; i < 2*(3*labelChunkLen+3)+1; i++ {
		k := fmt.Sprintf("k%03d", i)
		v, ok := ml.Lookup(k)
		if want, wantOK := many[k]; v != want || ok != wantOK {
			t.Errorf("Lookup(%s) = %q, %v; want %q, %v", k, v, ok, want, wantOK)
		}
	}
	if ml.Has("") || ml.Has("zzz") || ml.Len() != len(many) || !maps.Equal(ml.Map(), many) {
		t.Errorf("labels across chunks: Len %d, Map %v", ml.Len(), ml.Map())
	}
	// A label selector reads Labels as it reads a map.
	sel, err := labels.Parse("zone in (a,b),!gpu,nvidia.com/gpu.product=H100")
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(l) || sel.Matches(NewLabels(map[string]string{"zone": "c"})) {
		t.Errorf("selector %s matched wrongly", sel)
	}
}

// TestAffinityNodeReadsAsFullNode: a node's nodeSelector and required
// affinity checks, which give the affinity only the labels it names, decide
// as the scheduler's matcher does given every label of the node.
func TestAffinityNodeReadsAsFullNode(t *testing.T) {
	nodes := []*NodeInfo{
		{Name: "gpu-1", Labels: NewLabels(map[string]string{"zone": "a", "gpus": "8", "gpu": "h100", "pool": "train", "kubernetes.io/hostname": "gpu-1"})},
		{Name: "gpu-2", Labels: NewLabels(map[string]string{"zone": "b", "gpus": "2", "kubernetes.io/hostname": "gpu-2"})},
		{Name: "gpu-3", Labels: NewLabels(nil)},
	}
	expr := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	terms := [][]corev1.NodeSelectorTerm{
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("zone", corev1.NodeSelectorOpIn, "a", "c")}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("zone", corev1.NodeSelectorOpNotIn, "a")}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("gpu", corev1.NodeSelectorOpExists)}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("gpu", corev1.NodeSelectorOpDoesNotExist)}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("gpus", corev1.NodeSelectorOpGt, "4")}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("gpus", corev1.NodeSelectorOpLt, "4"), expr("zone", corev1.NodeSelectorOpIn, "b")}}},
		{{MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", corev1.NodeSelectorOpIn, "gpu-2")}}},
		{{MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", corev1.NodeSelectorOpNotIn, "gpu-2")}, MatchExpressions: []corev1.NodeSelectorRequirement{expr("pool", corev1.NodeSelectorOpExists)}}},
		{{}, {MatchExpressions: []corev1.NodeSelectorRequirement{expr("zone", corev1.NodeSelectorOpIn, "b")}}},
		{{MatchExpressions: []corev1.NodeSelectorRequirement{expr("zone", "Bogus", "a")}}, {MatchExpressions: []corev1.NodeSelectorRequirement{expr("gpus", corev1.NodeSelectorOpGt, "x")}}},
		{},
	}
	for i, ts := range terms {
		for _, sel := range []map[string]string{nil, {"pool": "train"}} {
			pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: sel, Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: ts}}}}}
			affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
			r := &request{affinity: newNodeAffinity(pod)}
			for _, n := range nodes {
				want, wantErr := affinity.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels.Map()}})
				got := r.nodeMismatch(pod, n, nil)
				if (got.kind == fits) != want {
					t.Errorf("terms %d, nodeSelector %v, node %s: mismatch %v with the named labels, matched %v (%v) with all", i, sel, n.Name, got.kind, want, wantErr)
				}
			}
		}
	}
}

// TestLabelsShareChunks: nodes of a pool (the load script's, 114 labels)
// share every chunk of labels but those holding a label of their own.
func TestLabelsShareChunks(t *testing.T) {
	a, b := NewLabels(workload.Node(0).Labels), NewLabels(workload.Node(3).Labels)
	if a.Len() != 114 || !maps.Equal(a.Map(), workload.Node(0).Labels) {
		t.Fatalf("labels of node 0: %d, %v", a.Len(), a.Map())
	}
	own := 0
	for i := range a.chunks {
		if a.chunks[i] != b.chunks[i] {
			own++
		}
	}
	// The hostname and GPU feature discovery's timestamp differ.
	if own == 0 || own > 2 {
		t.Errorf("%d of %d chunks differ between two nodes of a pool, want 1 or 2", own, len(a.chunks))
	}
}
