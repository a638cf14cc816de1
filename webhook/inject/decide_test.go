package inject_test

import (
	"encoding/json"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
)

// TestDecideThenApply: for every golden case, the decision reads the pod
// without changing it, and Mutate's result is the one the decision calls
// for: a denial for deny, the pod as it came for skip, a change without a
// layout for admit, and for inject the layout of the delivery chosen.
func TestDecideThenApply(t *testing.T) {
	seen := map[string]bool{}
	clustertest.ForEach(t, "testdata", func(t *testing.T, _ string, gc clustertest.Case) {
		pod := gc.Pod.DeepCopy()
		want, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		outcome, reason, delivery := Decide(gc.Input(t, pod), gc.Config)
		if got, _ := json.Marshal(pod); string(got) != string(want) {
			t.Fatalf("deciding changed the pod:\n%s\n%s", want, got)
		}
		seen[outcome+"/"+delivery] = true
		res := Mutate(gc.Input(t, pod), gc.Config)
		switch outcome {
		case "deny":
			if res.Decision != DecisionDenied || delivery != "none" {
				t.Errorf("decision %s, delivery %s for outcome deny", res.Decision, delivery)
			}
		case "skip", "admit":
			wantDecision := DecisionSkipped
			if outcome == "admit" {
				wantDecision = DecisionInjected
			}
			if res.Decision != wantDecision || res.Reason != reason || res.Layout != nil || delivery != "none" {
				t.Errorf("decision %s/%s (layout %v), delivery %s for outcome %s/%s", res.Decision, res.Reason, res.Layout != nil, delivery, outcome, reason)
			}
		case "inject":
			if res.Decision == DecisionDenied || res.Layout == nil || reason != "" {
				t.Fatalf("decision %s/%s (layout %v) for outcome inject/%s", res.Decision, res.Reason, res.Layout != nil, reason)
			}
			if res.Decision == DecisionSkipped && res.Reason != ReasonAlreadyInjected {
				t.Errorf("an injection that changes nothing is skipped as %q, want %q", res.Reason, ReasonAlreadyInjected)
			}
			if got := deliveredBy(res.Layout); got != delivery {
				t.Errorf("delivery %s, but the layout injected is delivered by %s", delivery, got)
			}
		default:
			t.Errorf("unknown outcome %q", outcome)
		}
	})
	for _, k := range []string{"deny/none", "skip/none", "admit/none", "inject/hostPath", "inject/nodeRuntime", "inject/nri"} {
		if !seen[k] {
			t.Errorf("no golden case decides %s", k)
		}
	}
}

// deliveredBy names how the layout a pod was injected with reaches it.
func deliveredBy(l *Layout) string {
	switch {
	case l.Runtime:
		return "nri"
	case l.Plan.RuntimeInjection != "":
		return "nodeRuntime"
	}
	return "hostPath"
}
