package gpunodes_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
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

var (
	streamedListNodes = flag.Int("streamed-list-nodes", 5000, "nodes that BenchmarkIndexStreamedList streams")
	streamedListSoft  = flag.Int64("streamed-list-soft-limit", 0, "the Go soft memory limit in bytes while BenchmarkIndexStreamedList runs (0: none)")
)

// BenchmarkIndexStreamedList is the webhook's first list in process: the
// load script's nodes streamed as an API server streams a list (watch-list:
// Added events, then the bookmark) into the index through client-go's
// reflector, each Node encoded and decoded as protobuf on its way, so that
// it makes the garbage a real list makes. It reports the time until the
// index is ready, the most the collector found live and the most heap
// objects (live and garbage) while the list streamed, and the collections
// it took. -streamed-list-nodes sets the size (65000 for the largest
// cluster), -streamed-list-soft-limit a Go soft memory limit (234881024 is
// a 256Mi container's); run it alone, with -benchtime 1x.
func BenchmarkIndexStreamedList(b *testing.B) {
	if *streamedListSoft > 0 {
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(*streamedListSoft))
	}
	nodes := *streamedListNodes
	for b.Loop() {
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(context.Context, metav1.ListOptions) (kruntime.Object, error) {
				return nil, errors.New("the benchmark streams its lists")
			},
			WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
				w := watch.NewFakeWithChanSize(64, false)
				if o.SendInitialEvents == nil || !*o.SendInitialEvents {
					return w, nil
				}
				go func() {
					for i := range nodes {
						data, err := workload.ReadyNode(i).Marshal()
						if err != nil {
							panic(err)
						}
						n := &corev1.Node{}
						if err := n.Unmarshal(data); err != nil {
							panic(err)
						}
						n.ResourceVersion = strconv.Itoa(10 + i)
						w.Add(n)
					}
					w.Action(watch.Bookmark, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.Itoa(10 + nodes),
						Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
				}()
				return w, nil
			},
		}
		samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
		metrics.Read(samples)
		cycles := samples[2].Value.Uint64()
		idx := gpunodes.NewIndex(config.Default(), logr.Discard())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); idx.Watch(ctx, lw) }()
		start := time.Now()
		var live, objects uint64
		for !idx.Ready() {
			if time.Since(start) > 5*time.Minute {
				b.Fatal("the index is not ready after 5 minutes")
			}
			metrics.Read(samples)
			live, objects = max(live, samples[0].Value.Uint64()), max(objects, samples[1].Value.Uint64())
			time.Sleep(5 * time.Millisecond)
		}
		ready := time.Since(start)
		metrics.Read(samples)
		cancel()
		<-done
		b.ReportMetric(ready.Seconds(), "s-to-ready")
		b.ReportMetric(float64(live)/(1<<20), "live-max-MiB")
		b.ReportMetric(float64(objects)/(1<<20), "heap-objects-max-MiB")
		b.ReportMetric(float64(samples[2].Value.Uint64()-cycles), "gc-cycles")
	}
}
