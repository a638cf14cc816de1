package inject

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

func in(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
}

// TestPoolTerms: Ins over several labels would admit a mix of values that
// names another pool; pools that are every combination of their values are
// said by one term.
func TestPoolTerms(t *testing.T) {
	p := func(pool, typ string) map[string]string {
		return map[string]string{"karpenter.sh/nodepool": pool, "node.kubernetes.io/instance-type": typ}
	}
	for _, tc := range []struct {
		name  string
		pools []map[string]string
		want  [][]corev1.NodeSelectorRequirement
	}{
		{"one label differs", []map[string]string{p("spot", "p4d"), p("od", "p4d")},
			[][]corev1.NodeSelectorRequirement{{in("karpenter.sh/nodepool", "od", "spot"), in("node.kubernetes.io/instance-type", "p4d")}}},
		{"every combination", []map[string]string{p("spot", "p4d"), p("od", "p4d"), p("spot", "p5"), p("od", "p5")},
			[][]corev1.NodeSelectorRequirement{{in("karpenter.sh/nodepool", "od", "spot"), in("node.kubernetes.io/instance-type", "p4d", "p5")}}},
		{"two labels differ", []map[string]string{p("spot", "p4d"), p("od", "p5")},
			[][]corev1.NodeSelectorRequirement{
				{in("karpenter.sh/nodepool", "spot"), in("node.kubernetes.io/instance-type", "p4d")},
				{in("karpenter.sh/nodepool", "od"), in("node.kubernetes.io/instance-type", "p5")},
			}},
	} {
		if got := poolTerms(tc.pools); !apiequality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("%s: poolTerms = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPinToPoolsTerms: the pin is ANDed into each of the pod's terms, an
// empty term (which matches no node) stays empty, and a second pin
// changes nothing.
func TestPinToPoolsTerms(t *testing.T) {
	pools := []map[string]string{{"pool": "a"}, {"pool": "b"}}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("zone", "z1")}},
			{},
			{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}},
		}},
	}}}}
	c := &change{editor: editor{pod: pod}}
	pinToPools(c, pools)
	pin := in("pool", "a", "b")
	want := []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{in("zone", "z1"), pin}},
		{},
		{MatchExpressions: []corev1.NodeSelectorRequirement{pin}, MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}},
	}
	got := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Fatalf("terms = %+v, want %+v", got, want)
	}
	n := len(c.edits)
	pinToPools(c, pools)
	if len(c.edits) != n {
		t.Fatal("a second pin changed the pod")
	}
}
