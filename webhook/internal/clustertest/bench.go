package clustertest

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// BenchNodes is the size of the benchmarks' clusters.
const BenchNodes = 5000

// BenchIndex is a cluster of 5,000 GPU nodes of three driver layouts, some
// tainted, in three zones.
func BenchIndex(b testing.TB, cfg *config.Configuration) (*gpunodes.Index, []*corev1.Node) {
	b.Helper()
	plans := []layout.Plan{gputest.Plan("470.256.02"), gputest.Plan("535.104.05"), gputest.Plan("550.54.15")}
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	nodes := make([]*corev1.Node, BenchNodes)
	for i := range nodes {
		nodes[i] = gputest.Node(fmt.Sprintf("gpu-%05d", i), plans[i%3], 8, func(n *corev1.Node) {
			n.Labels["topology.kubernetes.io/zone"] = fmt.Sprintf("zone-%d", i%3)
			if i%10 == 0 {
				n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}
			}
		})
		idx.Add(nodes[i])
	}
	if got := len(idx.Layouts()); got != 3 {
		b.Fatalf("index has %d layouts, want 3", got)
	}
	return idx, nodes
}

// LooseFileIndex is 5,000 GPU nodes as the load script creates them: three
// pools, most GPUs on a loose-file layout (19 file mounts), every tenth node
// tainted, three zones, a kubelet's labels and status.
func LooseFileIndex(b testing.TB, cfg *config.Configuration) *gpunodes.Index {
	b.Helper()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	if err := gpunodes.NewNodeStore(idx).Replace(StreamedNodes(b, cfg), ""); err != nil {
		b.Fatal(err)
	}
	if got := len(idx.Layouts()); got != len(workload.Pools()) {
		b.Fatalf("index has %d layouts, want %d", got, len(workload.Pools()))
	}
	return idx
}

// LooseFileNodes are the load script's 5,000 nodes (114 labels each), as
// a watch event delivers them.
func LooseFileNodes() []*corev1.Node {
	nodes := make([]*corev1.Node, BenchNodes)
	for i := range nodes {
		nodes[i] = workload.ReadyNode(i)
	}
	return nodes
}

// StreamedNodes are the same nodes as a reflector hands over a streamed
// first list: each through the index's Transform.
func StreamedNodes(b testing.TB, cfg *config.Configuration) []any {
	b.Helper()
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	list := make([]any, BenchNodes)
	for i, n := range LooseFileNodes() {
		var err error
		if list[i], err = idx.Transform(n); err != nil {
			b.Fatal(err)
		}
	}
	return list
}
