package webhook

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
)

// TestDecodePodMatchesFullDecode runs every golden case as the webhook does,
// from decodePod's partial pod, and as the offline command does, from the
// whole pod: a field Mutate reads that decodePod skips shows up here.
func TestDecodePodMatchesFullDecode(t *testing.T) {
	clustertest.ForEach(t, filepath.Join("inject", "testdata"), func(t *testing.T, _ string, gc clustertest.Case) {
		raw, err := json.Marshal(gc.Pod)
		if err != nil {
			t.Fatal(err)
		}
		slim, err := decodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		// The handler resolves the pod's claims from the partial pod too.
		fullIn, partIn := gc.Input(t, gc.Pod.DeepCopy()), gc.Input(t, slim)
		fullIn.Seed, partIn.Seed = 7, 7
		full := inject.Mutate(fullIn, gc.Config)
		part := inject.Mutate(partIn, gc.Config)
		a, b := clustertest.MustJSON(t, full.Patch), clustertest.MustJSON(t, part.Patch)
		if full.Decision != part.Decision || full.Reason != part.Reason || !slices.Equal(full.Warnings, part.Warnings) || a != b {
			t.Errorf("decoded in part: %s/%s %q\n%s\nwhole pod: %s/%s %q\n%s", part.Decision, part.Reason, part.Warnings, b, full.Decision, full.Reason, full.Warnings, a)
		}
	})
}
