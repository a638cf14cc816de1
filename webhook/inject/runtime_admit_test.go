package inject_test

import (
	"encoding/json"
	"strings"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestRuntimeDeliveryReadsNoNode: with driverDelivery: Runtime, every golden
// pod the NRI plugin serves gets the same answer whatever the cluster's
// nodes, none included, and that answer carries neither a pin nor
// LD_LIBRARY_PATH: admission decides it from the pod alone.
func TestRuntimeDeliveryReadsNoNode(t *testing.T) {
	served := 0
	clustertest.ForEach(t, "testdata", func(t *testing.T, _ string, gc clustertest.Case) {
		cfg := *gc.Config
		cfg.DriverDelivery = config.DeliveryRuntime
		withNodes := gc.Input(t, gc.Pod.DeepCopy())
		if _, _, delivery := Decide(withNodes, &cfg); delivery != "nri" {
			return
		}
		served++
		res := Mutate(withNodes, &cfg)
		noNodes := gc.Input(t, gc.Pod.DeepCopy())
		noNodes.Layouts, noNodes.Wedged = nil, nil
		if _, _, delivery := Decide(noNodes, &cfg); delivery != "nri" {
			t.Fatalf("delivery %s without nodes, nri with them", delivery)
		}
		bare := Mutate(noNodes, &cfg)
		a, _ := json.Marshal(res.Patch)
		b, _ := json.Marshal(bare.Patch)
		if string(a) != string(b) || strings.Join(res.Warnings, "\n") != strings.Join(bare.Warnings, "\n") {
			t.Errorf("the nodes changed the answer:\nwith:    %s\nwithout: %s", a, b)
		}
		if prev, _ := PreviousInjection(gc.Pod); prev != nil && prev.Runtime != "" {
			// An earlier version's pin and LD_LIBRARY_PATH stay where they are.
			return
		}
		for _, op := range res.Patch {
			if strings.Contains(op.Path, "/nodeSelector") || strings.Contains(string(mustJSON(t, op.Value)), EnvLDLibraryPath) {
				t.Errorf("patch operation %s %s %s: want no pin and no %s", op.Operation, op.Path, mustJSON(t, op.Value), EnvLDLibraryPath)
			}
		}
		if res.Layout == nil || !res.Layout.Runtime || withNodes.Pod.Annotations[layout.AnnotationRuntimeInject] == "" {
			t.Errorf("layout %+v, marker %q: want a runtime injection with its marker", res.Layout, withNodes.Pod.Annotations[layout.AnnotationRuntimeInject])
		}
	})
	if served == 0 {
		t.Fatal("no golden case is served by the NRI plugin")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
