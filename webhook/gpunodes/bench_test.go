package gpunodes_test

import (
	"testing"

	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/clustertest"
)

// BenchmarkIndexUpdate is one Node event on a 5,000-node index: "change"
// moves a node's allocatable GPUs, so its layout is republished; "heartbeat"
// is a status update that changes nothing the index keeps.
func BenchmarkIndexUpdate(b *testing.B) {
	cfg := config.Default()
	b.Run("change", func(b *testing.B) {
		nodes := clustertest.LooseFileNodes()
		idx := clustertest.LooseFileIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			n := nodes[i%clustertest.BenchNodes]
			q := n.Status.Allocatable["nvidia.com/gpu"]
			q.Set(12 - q.Value()) // 8 <-> 4, 4 <-> 8, 1 <-> 11: every event is a change
			n.Status.Allocatable["nvidia.com/gpu"] = q
			idx.Update(n)
			i++
		}
	})
	b.Run("heartbeat", func(b *testing.B) {
		nodes := clustertest.LooseFileNodes()
		idx := clustertest.LooseFileIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			idx.Update(nodes[i%clustertest.BenchNodes])
			i++
		}
	})
	b.Run("list", func(b *testing.B) {
		// The first list of the load script's 5,000 nodes, as a reflector
		// hands it over: stripped while streamed, recorded at once.
		list := clustertest.StreamedNodes(b, cfg)
		b.ReportAllocs()
		for b.Loop() {
			idx := gpunodes.NewIndex(cfg, logr.Discard())
			if err := gpunodes.NewNodeStore(idx).Replace(list, ""); err != nil {
				b.Fatal(err)
			}
			if len(idx.Layouts()) != len(workload.Pools()) {
				b.Fatalf("index has %d layouts", len(idx.Layouts()))
			}
		}
	})
	b.Run("transform", func(b *testing.B) {
		// One Node of a streamed list, stripped and its 114 labels
		// interned; the nodes take turns, so each one's own labels (its
		// hostname, a timestamp) are as new as they are in a real list.
		// The Node's deep copy is part of the time.
		idx := gpunodes.NewIndex(cfg, logr.Discard())
		nodes := clustertest.LooseFileNodes()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := idx.Transform(nodes[i%clustertest.BenchNodes].DeepCopy()); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkIndexUpdatePools is BenchmarkIndexUpdate with pinning by pool:
// 5,000 nodes in three uniform pools (by zone). A change rebuilds the pool
// view over every node; a heartbeat must stay as cheap as without pools.
func BenchmarkIndexUpdatePools(b *testing.B) {
	cfg := config.Default()
	cfg.Pinning.NodeLabels = []string{"topology.kubernetes.io/zone"}
	b.Run("change", func(b *testing.B) {
		idx, nodes := clustertest.BenchIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			n := nodes[i%clustertest.BenchNodes]
			q := n.Status.Allocatable["nvidia.com/gpu"]
			q.Set(12 - q.Value())
			n.Status.Allocatable["nvidia.com/gpu"] = q
			idx.Update(n)
			i++
		}
	})
	b.Run("heartbeat", func(b *testing.B) {
		idx, nodes := clustertest.BenchIndex(b, cfg)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			idx.Update(nodes[i%clustertest.BenchNodes])
			i++
		}
	})
}
