package offline

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-injector/gpu-injector/config"
)

// FuzzClusterFile feeds the reader of the cluster's files arbitrary input,
// as a user's repository or a pipeline holds it: it never panics, takes no
// more objects than MaxObjects, and what it takes builds the decision's
// sources and their notes without a panic, in bounded time.
func FuzzClusterFile(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: n, labels: {gpu-injector.io/state: ready}}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: ml}}\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-1","labels":{"gpu-injector.io/state":"ready","gpu-injector.io/layout-fingerprint":"x"},"annotations":{"gpu-injector.io/layout":"{}"}}}`))
	f.Add([]byte("kind: ConfigMap\nmetadata: {name: m}\ndata: {pool-0: '{'}\n---\nkind: ResourceSlice\napiVersion: resource.k8s.io/v1\nmetadata: {name: s}\nspec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: p, resourceSliceCount: 1}}\n"))
	f.Add([]byte("kind: NodeList\nitems: [[1]]\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	cfg := config.Default()
	cfg.Pinning.NodeLabels = []string{"pool"}
	clk := clocktesting.NewFakePassiveClock(now)
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		objs, err := DecodeObjects(data)
		if err != nil {
			return
		}
		if len(objs) > MaxObjects {
			t.Fatalf("%d objects", len(objs))
		}
		var c Cluster
		for _, o := range objs {
			if _, err := c.Add(o); err != nil {
				return
			}
		}
		b, _ := c.Builder(cfg, clk, logr.Discard())
		_ = b.Layouts.Layouts()
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%d bytes took %v", len(data), d)
		}
	})
}
