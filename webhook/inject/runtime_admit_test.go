package inject_test

import (
	"strings"
	"testing"

	. "github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestRuntimeDeliveryReadsNoNode: with driverDelivery: Runtime, every golden
// pod the NRI plugin serves gets the same answer whatever the cluster's
// nodes, none included, and that answer carries neither a pin nor
// LD_LIBRARY_PATH: admission decides it from the pod alone (and its images:
// the CUDA need's node affinity is no layout pin).
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
		a, b := clustertest.MustJSON(t, res.Patch), clustertest.MustJSON(t, bare.Patch)
		if a != b || strings.Join(res.Warnings, "\n") != strings.Join(bare.Warnings, "\n") {
			t.Errorf("the nodes changed the answer:\nwith:    %s\nwithout: %s", a, b)
		}
		if prev, _ := PreviousInjection(gc.Pod); prev != nil && prev.Runtime != "" {
			// An earlier version's pin and LD_LIBRARY_PATH stay where they are.
			return
		}
		for _, op := range res.Patch {
			if v := clustertest.MustJSON(t, op.Value); (op.Path == "/spec/nodeSelector" || strings.HasPrefix(op.Path, "/spec/nodeSelector/")) || strings.Contains(v, EnvLDLibraryPath) {
				t.Errorf("patch operation %s %s %s: want no pin and no %s", op.Operation, op.Path, v, EnvLDLibraryPath)
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

// TestRuntimeDeliveryPatch: the patch of a runtime injection is the same
// three operations whatever the pod's size (the marker, NRI's
// required-plugins annotation, the injection record), and its size is
// logged for docs/benchmarks.md: go test -run TestRuntimeDeliveryPatch -v
// ./webhook/inject/
func TestRuntimeDeliveryPatch(t *testing.T) {
	cfg := config.Default()
	cfg.DriverDelivery = config.DeliveryRuntime
	for _, size := range workload.Sizes {
		pod := workload.Pod(size.Name, size.Bytes)
		podBytes := len(clustertest.MustJSON(t, pod))
		res := Mutate(Input{Pod: pod}, cfg)
		if res.Decision != DecisionInjected || res.Layout == nil || !res.Layout.Runtime {
			t.Fatalf("%s: %s %s, want a runtime injection", size.Name, res.Decision, res.Reason)
		}
		patch := clustertest.PatchBytes(t, res.Patch)
		if len(res.Patch) != 3 || strings.Contains(string(patch), EnvLDLibraryPath) {
			t.Errorf("%s: %d operations, want 3 and no %s:\n%s", size.Name, len(res.Patch), EnvLDLibraryPath, patch)
		}
		t.Logf("%s pod (%d bytes of JSON): %d operations, %d bytes of patch", size.Name, podBytes, len(res.Patch), len(patch))
	}
}
