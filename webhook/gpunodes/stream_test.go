package gpunodes

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
)

// streamNodes is the size of the streamed lists below: enough for every
// pool, zone and odd case to hold many nodes.
const streamNodes = 3000

// streamNode is the load script's node i (114 labels, three uniform pools)
// with, every so often, what makes a node other than a candidate: wedged,
// cordoned, not Ready, a layout whose fingerprint does not match its label,
// not probed yet, no NVIDIA device. gen changes the labels of some nodes (a relist after GPU
// feature discovery relabelled them).
func streamNode(i, gen int) *corev1.Node {
	n := workload.ReadyNode(i)
	switch {
	case i%17 == 0:
		n.Labels[layout.LabelState] = layout.StateWedged
		n.Annotations[layout.AnnotationStateReason] = fmt.Sprintf("DriverWedged: hung\nsince %d", gen)
	case i%19 == 0:
		n.Spec.Unschedulable = true
	case i%23 == 0:
		n.Status.Conditions[len(n.Status.Conditions)-1].Status = corev1.ConditionFalse
	case i%29 == 0:
		n.Labels[layout.LabelFingerprint] = "0123456789abcdef"
	case i%31 == 0:
		delete(n.Labels, layout.LabelState)
	case i%37 == 0:
		n.Labels[layout.LabelState] = layout.StateNoDriver
	}
	if gen > 0 && i%7 == 0 {
		n.Labels["nvidia.com/gfd.timestamp"] = fmt.Sprint(1800000000 + i)
	}
	return n
}

// streamList are the nodes of one list: every node of [0, streamNodes)
// but those gone.
func streamList(gen int, gone func(int) bool) []*corev1.Node {
	var nodes []*corev1.Node
	for i := range streamNodes {
		if !gone(i) {
			nodes = append(nodes, streamNode(i, gen))
		}
	}
	return nodes
}

// probed counts the nodes that ProbedNodes selects: those the index keeps
// of a list that an API server did not filter.
func probed(nodes []*corev1.Node) int {
	n := 0
	for _, node := range nodes {
		if ProbedNodes().Matches(labels.Set(node.Labels)) {
			n++
		}
	}
	return n
}

// streamInto records nodes as a reflector records a streamed list: each
// through Transform as it arrives (into its temporary store), then the
// transformed items at once through NodeStore.Replace.
func streamInto(t *testing.T, idx *Index, nodes []*corev1.Node) {
	t.Helper()
	store := NewNodeStore(idx)
	items := make([]any, len(nodes))
	for i, n := range nodes {
		var err error
		if items[i], err = store.Transformer()(n.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		if _, ok := items[i].(*streamedNode); !ok {
			t.Fatalf("transform made a %T of a Node", items[i])
		}
	}
	if err := store.Replace(items, "10"); err != nil {
		t.Fatal(err)
	}
}

// TestStreamedListLikeWholeNodes: an index built from a streamed list,
// where only what Transform read of each Node is held until the list ends,
// equals one built from the whole Nodes: its layouts and their nodes (as
// interned labels compare: the same values), its wedged nodes, its pools;
// and a relist in which some nodes are gone and some relabelled forgets
// and changes them alike. One node has DRA GPUs, which Transform cannot
// read: they are added when the node is recorded.
func TestStreamedListLikeWholeNodes(t *testing.T) {
	for _, keys := range [][]string{nil, {"topology.kubernetes.io/zone"}} {
		t.Run(fmt.Sprintf("pools=%v", keys), func(t *testing.T) {
			cfg := config.Default()
			cfg.Pinning.NodeLabels = keys
			streamed, whole := NewIndex(cfg, logr.Discard()), NewIndex(cfg, logr.Discard())
			now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
			for _, idx := range []*Index{streamed, whole} {
				idx.SetClock(clocktesting.NewFakePassiveClock(now))
				idx.SetDRAGPUs("gpu-00004", 2)
			}

			first := streamList(0, func(int) bool { return false })
			streamInto(t, streamed, first)
			whole.Replace(first)
			assertSameIndex(t, "first list", streamed, whole, now)
			if w := streamed.Wedged(); len(w) == 0 || len(streamed.Layouts()) < len(workload.Pools()) {
				t.Fatalf("the list has %d layouts and %d wedged nodes: the test's nodes are not what it means", len(streamed.Layouts()), len(w))
			}
			if got := nodeGPUs(streamed, "gpu-00004"); got != 6 {
				t.Errorf("node with DRA GPUs counts %d GPUs, want 2 + its own 4", got)
			}

			gone := func(i int) bool { return i%5 == 0 }
			relist := streamList(1, gone)
			streamInto(t, streamed, relist)
			whole.Replace(relist)
			assertSameIndex(t, "relist", streamed, whole, now)
			names := streamed.nodeNames()
			if want := probed(relist); len(names) != want || want == len(relist) {
				t.Errorf("after the relist the index has %d nodes, want the %d of %d that the probe labelled with a GPU state", len(names), want, len(relist))
			}
			if slices.Contains(names, "gpu-00005") || !slices.Contains(names, "gpu-00001") {
				t.Errorf("after the relist: nodes %v..., want gpu-00005 forgotten", names[:5])
			}
		})
	}
}

// nodeGPUs is the GPUs that a node counts for in its layout, 0 if none.
func nodeGPUs(idx *Index, name string) int64 {
	for _, l := range idx.Layouts() {
		for _, n := range l.Nodes {
			if n.Name == name {
				return n.AllocatableGPUs
			}
		}
	}
	return 0
}

// assertSameIndex compares everything the injection and the pool memory
// read of two indexes.
func assertSameIndex(t *testing.T, when string, got, want *Index, now time.Time) {
	t.Helper()
	gl, wl := got.Layouts(), want.Layouts()
	if len(gl) != len(wl) {
		t.Fatalf("%s: %d layouts, want %d", when, len(gl), len(wl))
	}
	for i := range gl {
		g, w := gl[i], wl[i]
		if g.Fingerprint != w.Fingerprint || g.Pool != w.Pool || g.AllocatableGPUs != w.AllocatableGPUs ||
			!reflect.DeepEqual(g.NodeSelector, w.NodeSelector) || !slices.Equal(g.MixedPools, w.MixedPools) ||
			!reflect.DeepEqual(g.Plan, w.Plan) || len(g.Nodes) != len(w.Nodes) {
			t.Fatalf("%s: layout %d is %s pool %q, %d GPUs, %d nodes, mixed %v; want %s pool %q, %d GPUs, %d nodes, mixed %v", when, i,
				g.Fingerprint, g.Pool, g.AllocatableGPUs, len(g.Nodes), g.MixedPools, w.Fingerprint, w.Pool, w.AllocatableGPUs, len(w.Nodes), w.MixedPools)
		}
		for j := range g.Nodes {
			gn, wn := g.Nodes[j], w.Nodes[j]
			if gn.Name != wn.Name || gn.Pool != wn.Pool || gn.AllocatableGPUs != wn.AllocatableGPUs || gn.GPUs != wn.GPUs ||
				!gn.Labels.Equal(wn.Labels) || !reflect.DeepEqual(gn.Taints, wn.Taints) {
				t.Fatalf("%s: layout %s node %d is %+v, want %+v", when, g.Fingerprint, j, *gn, *wn)
			}
		}
	}
	gw, ww := got.Wedged(), want.Wedged()
	if len(gw) != len(ww) {
		t.Fatalf("%s: %d wedged nodes, want %d", when, len(gw), len(ww))
	}
	for i := range gw {
		if gw[i].Node.Name != ww[i].Node.Name || gw[i].Reason != ww[i].Reason || !gw[i].Node.Labels.Equal(ww[i].Node.Labels) {
			t.Fatalf("%s: wedged node %d is %s (%q), want %s (%q)", when, i, gw[i].Node.Name, gw[i].Reason, ww[i].Node.Name, ww[i].Reason)
		}
	}
	if g, w := got.LivePools(now), want.LivePools(now); !reflect.DeepEqual(g, w) {
		t.Fatalf("%s: live pools\n%+v\nwant\n%+v", when, g, w)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	want.mu.Lock()
	defer want.mu.Unlock()
	if len(got.pools) != len(want.pools) {
		t.Fatalf("%s: %d pools, want %d", when, len(got.pools), len(want.pools))
	}
	for key, ps := range got.pools {
		if wp := want.pools[key]; wp == nil || !reflect.DeepEqual(ps.members, wp.members) || !reflect.DeepEqual(ps.labels, wp.labels) {
			t.Fatalf("%s: pool %s differs", when, key)
		}
	}
	for name, st := range got.nodes {
		w := want.nodes[name]
		if w == nil || st.fingerprint != w.fingerprint || st.source != w.source || st.rejected != w.rejected ||
			st.pool != w.pool || st.isMember != w.isMember || st.ownGPUs != w.ownGPUs {
			t.Fatalf("%s: node %s is %+v, want %+v", when, name, st, w)
		}
	}
}

// TestStreamedListThroughReflector runs client-go's reflector against an
// API server that streams its lists (watch-list: the Nodes as Added
// events, then a bookmark): the first stream breaks off halfway and is
// streamed again whole, as the reflector retries with a new temporary
// store; the index is then the whole-Node one. After the watch expires, the
// relist streams fewer nodes, and the index forgets the others.
func TestStreamedListThroughReflector(t *testing.T) {
	cfg := config.Default()
	first := streamList(0, func(int) bool { return false })
	relist := streamList(1, func(i int) bool { return i%5 == 0 })
	lists := [][]*corev1.Node{first[:len(first)/2], first, relist}
	broken := true
	watches := make(chan *watch.FakeWatcher, 4)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			t.Error("the reflector listed instead of streaming")
			return &corev1.NodeList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFakeWithChanSize(streamNodes+1, false)
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				nodes := lists[0]
				lists = lists[1:]
				for i, n := range nodes {
					n = n.DeepCopy()
					n.ResourceVersion = fmt.Sprint(10 + i)
					w.Add(n)
				}
				if broken {
					// The connection drops before the bookmark.
					broken = false
					w.Stop()
					return w, nil
				}
				w.Action(watch.Bookmark, &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: fmt.Sprint(10 + streamNodes),
					Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			}
			watches <- w
			return w, nil
		},
	}
	idx := NewIndex(cfg, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); idx.Watch(ctx, lw) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; %d nodes", what, len(idx.nodeNames()))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	w := <-watches
	waitFor("the first list", func() bool { return idx.Ready() })
	whole := NewIndex(cfg, logr.Discard())
	whole.Replace(first)
	assertSameIndex(t, "first list", idx, whole, time.Now())

	// Watch events after the list are recorded as before.
	n := first[1].DeepCopy()
	n.Status.Allocatable["nvidia.com/gpu"] = *resource.NewQuantity(2, resource.DecimalSI)
	w.Modify(n)
	waitFor("the update", func() bool { return nodeGPUs(idx, n.Name) == 2 })
	whole.Update(n)
	assertSameIndex(t, "update", idx, whole, time.Now())

	w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	<-watches
	waitFor("the relist", func() bool { return len(idx.nodeNames()) == probed(relist) })
	whole.Replace(relist)
	assertSameIndex(t, "relist", idx, whole, time.Now())
}
