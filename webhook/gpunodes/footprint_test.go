package gpunodes_test

import (
	"flag"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/loadtest/workload"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

// footprintHeap names a file for a heap profile taken while the index of
// BenchmarkIndexFootprint is alive (go tool pprof -sample_index=inuse_space).
var footprintHeap = flag.String("footprint-heap", "", "write a heap profile of the built index to this file")

// footprintNodes is the size of BenchmarkIndexFootprint's cluster.
const footprintNodes = 5000

// BenchmarkIndexFootprint reports the heap that the index keeps per node
// for the load script's nodes (114 labels, three uniform pools), built as a
// reflector builds it from a streamed first list: kept-B/node once the list
// is recorded and its garbage collected, listed-B/node what the streamed
// list holds just before it is recorded (the reflector's temporary store,
// on top of an empty index), and peak-B/node the most either held. Nodes are
// made one at a time, so no input is counted. "pools" pins pods by zone.
func BenchmarkIndexFootprint(b *testing.B) {
	if *footprintHeap != "" {
		// Every allocation, so that small ones are not sampled away.
		runtime.MemProfileRate = 1
	}
	for _, c := range []struct {
		name string
		keys []string
	}{{"fingerprint", nil}, {"pools", []string{"topology.kubernetes.io/zone"}}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := config.Default()
			cfg.Pinning.NodeLabels = c.keys
			var listed, kept float64
			for b.Loop() {
				listed, kept = footprint(b, cfg)
			}
			b.ReportMetric(listed/footprintNodes, "listed-B/node")
			b.ReportMetric(kept/footprintNodes, "kept-B/node")
			b.ReportMetric(max(listed, kept)/footprintNodes, "peak-B/node")
		})
	}
}

// footprint streams footprintNodes nodes into a new index and returns the
// live heap it added while the list was held and once it was recorded.
func footprint(b *testing.B, cfg *config.Configuration) (listed, kept float64) {
	b.Helper()
	base := liveHeap()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	list := make([]any, footprintNodes)
	for i := range list {
		var err error
		if list[i], err = idx.Transform(workload.ReadyNode(i)); err != nil {
			b.Fatal(err)
		}
	}
	listed = float64(liveHeap()) - float64(base)
	if err := gpunodes.NewNodeStore(idx).Replace(list, ""); err != nil {
		b.Fatal(err)
	}
	list = nil
	kept = float64(liveHeap()) - float64(base)
	if got := len(idx.Layouts()); got < len(workload.Pools()) {
		b.Fatalf("index has %d layouts, want at least %d", got, len(workload.Pools()))
	}
	if *footprintHeap != "" {
		f, err := os.Create(*footprintHeap)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
	runtime.KeepAlive(idx)
	return listed, kept
}

// liveHeap is the heap in use once garbage is collected. Interned values
// whose last handle went are removed from the unique package's maps by
// cleanups that run after a collection, on their own goroutine, and freed
// by the next: collect until the figure settles.
func liveHeap() uint64 {
	var m runtime.MemStats
	last := uint64(0)
	for range 10 {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if m.HeapAlloc == last {
			break
		}
		last = m.HeapAlloc
		time.Sleep(10 * time.Millisecond)
	}
	return m.HeapAlloc
}
