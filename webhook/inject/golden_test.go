package inject_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// goldenResult is what testdata/X.golden holds.
type goldenResult struct {
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason,omitempty"`
	Layout   string   `json:"layout,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Patch is what the webhook answers; Pod is the input with it applied.
	Patch []jsonpatch.Operation `json:"patch,omitempty"`
	Pod   *corev1.Pod           `json:"pod"`
}

// TestGolden runs every testdata/*.yaml through Mutate and compares with its
// .golden twin (REFRESH_GOLDEN=true rewrites them): the decision, the JSON
// Patch and the pod that patch makes of the input's JSON. It checks that the
// patch makes the same pod as the edits make on the typed pod, that it
// leaves fields this build does not know alone, and runs Mutate again on the
// result to prove a reinvocation changes nothing.
func TestGolden(t *testing.T) {
	refresh := os.Getenv("REFRESH_GOLDEN") == "true"
	clustertest.ForEach(t, "testdata", func(t *testing.T, base string, gc clustertest.Case) {
		pod := gc.Pod.DeepCopy()
		input := gc.Input(t, pod)
		res := Mutate(input, gc.Config)
		gputest.CheckUnchangedUnlessInjected(t, gc.Pod, pod, res)
		patched := clustertest.ApplyOps(t, gc.Pod, res.Patch)
		if !apiequality.Semantic.DeepEqual(patched, pod) {
			t.Errorf("the patch and the edits disagree:\n%s", clustertest.LineDiff(clustertest.MustYAML(t, pod), clustertest.MustYAML(t, patched)))
		}
		clustertest.AssertKeepsUnknownFields(t, gc.Pod, res.Patch)

		got := goldenResult{Decision: res.Decision, Reason: res.Reason, Warnings: res.Warnings, Patch: res.Patch, Pod: patched}
		if res.Layout != nil {
			got.Layout = res.Layout.Fingerprint + res.Layout.Static
		}
		out, err := yaml.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		goldenFile := filepath.Join("testdata", base+".golden")
		if refresh {
			if err := os.WriteFile(goldenFile, out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(goldenFile)
		if err != nil {
			t.Fatalf("failed to read golden file (run with REFRESH_GOLDEN=true to create it): %v", err)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("mutation differs from %s (REFRESH_GOLDEN=true to accept):\n%s", goldenFile, clustertest.LineDiff(string(want), string(out)))
		}
		clustertest.AssertHostPathsSafe(t, patched)

		again := patched.DeepCopy()
		input.Pod = again
		res2 := Mutate(input, gc.Config)
		if !apiequality.Semantic.DeepEqual(again, patched) || len(res2.Patch) > 0 {
			t.Errorf("second run changed the pod (patch %v):\n%s", res2.Patch, clustertest.LineDiff(clustertest.MustYAML(t, patched), clustertest.MustYAML(t, again)))
		}
		if res.Decision == DecisionInjected && res.Layout != nil && (res2.Decision != DecisionSkipped || res2.Reason != ReasonAlreadyInjected) {
			t.Errorf("second run: decision %s/%s, want Skipped/%s", res2.Decision, res2.Reason, ReasonAlreadyInjected)
		}
	})
}
