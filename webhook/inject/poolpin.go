package inject

import (
	"maps"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// pinToPools keeps the pod on the nodes of any of the pools (each pool's
// labels), with a required node affinity: a nodeSelector can name one pool
// only, and the scheduler and an autoscaler read an affinity's In terms as
// they read a selector. The pod's own required terms stay what they were,
// each ANDed with the pin (a term's requirements are ANDed, terms are
// ORed), so the pod may land only where both it and the pin allow.
func pinToPools(c *change, poolLabels []map[string]string) {
	pins := poolTerms(poolLabels)
	var own []corev1.NodeSelectorTerm
	if a := c.pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		own = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	if pinnedToPools(own, pins) {
		return
	}
	var terms []corev1.NodeSelectorTerm
	if len(own) == 0 {
		for _, p := range pins {
			terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: p})
		}
	}
	for _, t := range own {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			// An empty term matches no node: ANDing the pin into it would
			// make it match some.
			terms = append(terms, *t.DeepCopy())
			continue
		}
		for _, p := range pins {
			nt := t.DeepCopy()
			nt.MatchExpressions = append(nt.MatchExpressions, p...)
			terms = append(terms, *nt)
		}
	}
	c.do(setRequiredNodeAffinity{selector: &corev1.NodeSelector{NodeSelectorTerms: terms}})
}

// poolTerms are the requirements that select the nodes of any of the pools,
// each a term's worth, ORed. When the pools are every combination of their
// label values (one label, or pools that differ in one label only), one term
// of an In requirement per label says it; otherwise each pool is a term of
// its own, as Ins over several labels would also admit a mix of values that
// names another pool.
func poolTerms(poolLabels []map[string]string) [][]corev1.NodeSelectorRequirement {
	keys := slices.Sorted(maps.Keys(poolLabels[0]))
	values := make(map[string][]string, len(keys))
	combinations := 1
	for _, k := range keys {
		for _, pl := range poolLabels {
			if !slices.Contains(values[k], pl[k]) {
				values[k] = append(values[k], pl[k])
			}
		}
		slices.Sort(values[k])
		combinations *= len(values[k])
	}
	if combinations == len(poolLabels) {
		term := make([]corev1.NodeSelectorRequirement, 0, len(keys))
		for _, k := range keys {
			term = append(term, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: values[k]})
		}
		return [][]corev1.NodeSelectorRequirement{term}
	}
	out := make([][]corev1.NodeSelectorRequirement, 0, len(poolLabels))
	for _, pl := range poolLabels {
		term := make([]corev1.NodeSelectorRequirement, 0, len(keys))
		for _, k := range keys {
			term = append(term, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{pl[k]}})
		}
		out = append(out, term)
	}
	return out
}

// pinnedToPools reports whether every term already holds one of the pins
// whole: a second run, or a pod whose author wrote the same pin. An empty
// term matches no node with or without it.
func pinnedToPools(terms []corev1.NodeSelectorTerm, pins [][]corev1.NodeSelectorRequirement) bool {
	if len(terms) == 0 {
		return false
	}
	for _, t := range terms {
		if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
			continue
		}
		held := slices.ContainsFunc(pins, func(p []corev1.NodeSelectorRequirement) bool {
			for _, r := range p {
				if !slices.ContainsFunc(t.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool { return apiequality.Semantic.DeepEqual(e, r) }) {
					return false
				}
			}
			return true
		})
		if !held {
			return false
		}
	}
	return true
}

// setRequiredNodeAffinity replaces the pod's required node affinity.
type setRequiredNodeAffinity struct{ selector *corev1.NodeSelector }

func (e setRequiredNodeAffinity) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	switch a := pod.Spec.Affinity; {
	case a == nil:
		return append(out, jsonpatch.Operation{Operation: "add", Path: "/spec/affinity",
			Value: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: e.selector}}})
	case a.NodeAffinity == nil:
		return append(out, jsonpatch.Operation{Operation: "add", Path: "/spec/affinity/nodeAffinity",
			Value: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: e.selector}})
	}
	return append(out, jsonpatch.Operation{Operation: "add", Path: "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", Value: e.selector})
}

func (e setRequiredNodeAffinity) apply(pod *corev1.Pod) {
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = e.selector.DeepCopy()
}
