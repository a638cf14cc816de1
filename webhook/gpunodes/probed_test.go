package gpunodes

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

func TestProbedNodes(t *testing.T) {
	for state, want := range map[string]bool{
		layout.StateReady:    true,
		layout.StateError:    true,
		layout.StateWedged:   true,
		layout.StateNoDriver: false,
		"":                   false,
	} {
		l := labels.Set{"kubernetes.io/hostname": "n1"}
		if state != "" {
			l[layout.LabelState] = state
		}
		if got := ProbedNodes().Matches(l); got != want {
			t.Errorf("state %q: selected %v, want %v", state, got, want)
		}
	}
	if got, want := ProbedNodes().String(), "gpu-injector.io/state,gpu-injector.io/state!=no-driver"; got != want {
		t.Errorf("selector = %q, want %q", got, want)
	}
}

// TestNodeListWatchSelects: the lists and watches that NodeListWatch sends
// an API server ask for the nodes ProbedNodes selects.
func TestNodeListWatchSelects(t *testing.T) {
	var mu sync.Mutex
	var selectors []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		selectors = append(selectors, r.URL.Query().Get("labelSelector"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			return
		}
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`))
	}))
	defer srv.Close()
	nlw, err := NodeListWatch(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	lw := toolscache.ToListerWatcherWithContext(nlw)
	if _, err := lw.ListWithContext(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	mu.Lock()
	defer mu.Unlock()
	want := ProbedNodes().String()
	if len(selectors) != 2 || selectors[0] != want || selectors[1] != want {
		t.Errorf("label selectors sent = %q, want %q for the list and the watch", selectors, want)
	}
}

// TestIndexWatchProbedNodes runs the index against a fake clientset, whose
// list filters by the label selector (as an API server does) and whose
// watch does not: a node that stops matching ProbedNodes is forgotten
// whether it arrives as the API server sends it (a deletion) or as a change.
func TestIndexWatchProbedNodes(t *testing.T) {
	p := gputest.Plan("535.104.05")
	noDriver := func(n *corev1.Node) {
		delete(n.Labels, layout.LabelFingerprint)
		delete(n.Annotations, layout.AnnotationLayout)
		n.Labels[layout.LabelState] = layout.StateNoDriver
	}
	cs := fake.NewClientset(
		gputest.Node("gpu", p, 8, nil),
		gputest.WedgedNode("wedged", "DriverWedged: nvmlInit did not return", nil),
		gputest.Node("cpu", p, 0, noDriver),
		gputest.Node("new", p, 8, func(n *corev1.Node) { delete(n.Labels, layout.LabelState) }),
	)
	nodes := cs.CoreV1().Nodes()
	watching := make(chan struct{}, 1)
	lw := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			selectProbed(&o)
			return nodes.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			selectProbed(&o)
			w, err := nodes.Watch(ctx, o)
			watching <- struct{}{}
			return w, err
		},
	}
	idx := NewIndex(config.Default(), logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); idx.Watch(ctx, toolscache.ToListWatcherWithWatchListSemantics(lw, cs)) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; nodes %v", what, idx.nodeNames())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	names := func() []string { n := idx.nodeNames(); slices.Sort(n); return n }
	<-watching
	waitFor("the first list", func() bool { return idx.Ready() })
	if got := names(); !slices.Equal(got, []string{"gpu", "wedged"}) {
		t.Fatalf("nodes after the first list = %v, want gpu and wedged", got)
	}
	for _, a := range cs.Actions() {
		var sel labels.Selector
		switch a := a.(type) {
		case clienttesting.ListActionImpl:
			sel = a.GetListRestrictions().Labels
		case clienttesting.WatchActionImpl:
			sel = a.GetWatchRestrictions().Labels
		default:
			continue
		}
		if sel.String() != ProbedNodes().String() {
			t.Errorf("%s of nodes selected %q, want %q", a.GetVerb(), sel, ProbedNodes())
		}
	}

	// The probe's state label removed from the wedged node (an API server
	// sends a deletion, TestIndexWatch; the fake, a change): it is no longer
	// named in denials.
	update := func(n *corev1.Node) {
		t.Helper()
		if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	unlabelled := gputest.WedgedNode("wedged", "", func(n *corev1.Node) { delete(n.Labels, layout.LabelState) })
	update(unlabelled)
	waitFor("the change that unlabels the wedged node", func() bool { return len(idx.Wedged()) == 0 })
	if got := names(); !slices.Equal(got, []string{"gpu"}) {
		t.Errorf("nodes = %v, want gpu alone", got)
	}

	// The GPU node found without a device, and the CPU node with one.
	update(gputest.Node("gpu", p, 0, noDriver))
	update(gputest.Node("cpu", p, 8, nil))
	waitFor("the swap", func() bool { return slices.Equal(names(), []string{"cpu"}) })
	if ls := idx.Layouts(); len(ls) != 1 || !slices.Equal(layoutNodeNames(ls[0]), []string{"cpu"}) {
		t.Errorf("layouts = %v, want cpu's alone", ls)
	}
	if err := nodes.Delete(ctx, "cpu", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the delete", func() bool { return len(idx.nodeNames()) == 0 && len(idx.Layouts()) == 0 })
}

// TestIndexForgetsUnprobedNode: a Node the index is handed that ProbedNodes
// does not select (the offline command's --nodes file, a change on a watch
// that does not filter) is forgotten with all it lent: its layout, its place
// in its pool, its wedged entry.
func TestIndexForgetsUnprobedNode(t *testing.T) {
	cfg := poolConfig(t, "")
	p := gputest.Plan("535.104.05")
	idx := NewIndex(cfg, logr.Discard())
	idx.Update(gputest.Node("a1", p, 4, inPool("a")))
	idx.Update(gputest.Node("a2", p, 4, inPool("a")))
	idx.Update(gputest.WedgedNode("w1", "DriverWedged: hung", inPool("a")))
	idx.Update(gputest.Node("b1", p, 4, func(n *corev1.Node) { inPool("b")(n); n.Labels[layout.LabelState] = layout.StateError }))
	// A wedged node and one whose probe failed count in their pools.
	if len(idx.Wedged()) != 1 || len(idx.LivePools(time.Now())) != 0 {
		t.Fatalf("before: %d wedged, live pools %v; want 1 and none (both pools mixed)", len(idx.Wedged()), idx.LivePools(time.Now()))
	}

	idx.Update(gputest.WedgedNode("w1", "DriverWedged: hung", func(n *corev1.Node) { inPool("a")(n); delete(n.Labels, layout.LabelState) }))
	idx.Update(gputest.Node("a2", p, 4, func(n *corev1.Node) { inPool("a")(n); n.Labels[layout.LabelState] = layout.StateNoDriver }))
	if got := idx.Wedged(); len(got) != 0 {
		t.Errorf("wedged = %v after its label went, want none", wedgedNames(idx))
	}
	a := byPool(idx.Layouts())["karpenter.sh/nodepool=a/"+p.Fingerprint()]
	if a == nil || !slices.Equal(layoutNodeNames(a), []string{"a1"}) {
		t.Errorf("pool a = %+v, want it uniform with a1 alone", a)
	}
	if live := idx.LivePools(time.Now()); len(live) != 1 || live[0].Pool != poolLabel+"=a" {
		t.Errorf("live pools = %v, want pool a alone", live)
	}
	if got := idx.nodeNames(); len(got) != 2 || !slices.Contains(got, "a1") || !slices.Contains(got, "b1") {
		t.Errorf("nodes = %v, want a1 and b1", got)
	}
}

// TestDRAGPUsOfNodeProbedLater: the GPUs that ResourceSlices publish for a
// node the index does not keep yet (not probed) are counted once the node
// is probed, and again after it left the selector and came back.
func TestDRAGPUsOfNodeProbedLater(t *testing.T) {
	idx := NewIndex(config.Default(), logr.Discard())
	p := gputest.Plan("535.104.05")
	unprobed := gputest.Node("n1", p, 0, func(n *corev1.Node) { delete(n.Labels, layout.LabelState) })
	idx.Update(unprobed)
	idx.SetDRAGPUs("n1", 4)
	if ls := idx.Layouts(); len(ls) != 0 {
		t.Fatalf("layouts of a node not probed = %v", ls)
	}
	for _, when := range []string{"probed", "probed again"} {
		idx.Update(gputest.Node("n1", p, 0, nil))
		if ls := idx.Layouts(); len(ls) != 1 || ls[0].AllocatableGPUs != 4 {
			t.Errorf("%s: layouts %v, want one of 4 DRA GPUs", when, ls)
		}
		idx.Update(unprobed)
		if ls := idx.Layouts(); len(ls) != 0 {
			t.Errorf("%s, then its label removed: layouts %v, want none", when, ls)
		}
	}
}
