package gpunodes

import (
	"context"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

const poolLabel = "karpenter.sh/nodepool"

func poolConfig(t *testing.T, extra string) *config.Configuration {
	t.Helper()
	cfg, err := config.Parse([]byte("pinning: {nodeLabels: [" + poolLabel + "]" + extra + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func inPool(pool string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Labels[poolLabel] = pool
		n.Labels["node.kubernetes.io/instance-type"] = "g4dn.xlarge"
		n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
	}
}

func byPool(ls []*inject.Layout) map[string]*inject.Layout {
	m := map[string]*inject.Layout{}
	for _, l := range ls {
		m[l.Pool+"/"+l.Fingerprint] = l
	}
	return m
}

func TestIndexPools(t *testing.T) {
	cfg := poolConfig(t, "")
	old, neu := gputest.Plan("535.104.05"), gputest.Plan("580.65.06")
	idx := NewIndex(cfg, logr.Discard())
	idx.Update(gputest.Node("a1", old, 4, inPool("a")))
	idx.Update(gputest.Node("a2", old, 4, inPool("a")))
	idx.Update(gputest.Node("b1", old, 4, inPool("b")))
	idx.Update(gputest.Node("loose", old, 2, nil))

	// Pools a and b publish one layout: one choice, pinned to both.
	ls := byPool(idx.Layouts())
	ab := ls["karpenter.sh/nodepool=a karpenter.sh/nodepool=b/"+old.Fingerprint()]
	if ab == nil || len(ab.Nodes) != 3 || ab.AllocatableGPUs != 12 || ab.NodeSelector != nil ||
		len(ab.PoolLabels) != 2 || ab.PoolLabels[0][poolLabel] != "a" || ab.PoolLabels[1][poolLabel] != "b" {
		t.Fatalf("uniform pools a and b: %+v (layouts %v)", ab, keysOf(ls))
	}
	// Pool b upgrades as a whole: each pool is one layout's only pool,
	// pinned by its selector.
	idx.Update(gputest.Node("b1", neu, 4, inPool("b")))
	ls = byPool(idx.Layouts())
	a := ls["karpenter.sh/nodepool=a/"+old.Fingerprint()]
	if a == nil || len(a.Nodes) != 2 || a.AllocatableGPUs != 8 || a.NodeSelector[poolLabel] != "a" || len(a.NodeSelector) != 1 || len(a.PoolLabels) != 1 {
		t.Fatalf("uniform pool a: %+v (layouts %v)", a, keysOf(ls))
	}
	if b := ls["karpenter.sh/nodepool=b/"+neu.Fingerprint()]; b == nil || b.NodeSelector[poolLabel] != "b" {
		t.Fatalf("uniform pool b: %+v (layouts %v)", b, keysOf(ls))
	}
	idx.Update(gputest.Node("b1", old, 4, inPool("b")))
	if l := ls["/"+old.Fingerprint()]; l == nil || len(l.Nodes) != 1 || l.Nodes[0].Name != "loose" || l.NodeSelector != nil {
		t.Fatalf("a node in no pool must stay pinned by fingerprint: %+v", l)
	}

	// A node of pool a upgrades: the pool is mixed, its nodes fall back to
	// their fingerprints, and say so.
	idx.Update(gputest.Node("a2", neu, 4, inPool("a")))
	ls = byPool(idx.Layouts())
	if _, ok := ls["karpenter.sh/nodepool=a/"+old.Fingerprint()]; ok {
		t.Fatalf("mixed pool a still pinned by pool: %v", keysOf(ls))
	}
	if l := ls["/"+neu.Fingerprint()]; l == nil || len(l.MixedPools) != 1 || l.MixedPools[0] != "karpenter.sh/nodepool=a" {
		t.Fatalf("mixed pool's new layout: %+v", l)
	}
	if l := ls["karpenter.sh/nodepool=b/"+old.Fingerprint()]; l == nil {
		t.Fatalf("pool b must stay pinned by pool: %v", keysOf(ls))
	}

	// A ready node whose probe failed makes its pool mixed too; one not
	// probed yet (no state label) says nothing.
	idx.Update(gputest.Node("b2", old, 4, func(n *corev1.Node) { inPool("b")(n); n.Labels[layout.LabelState] = layout.StateError }))
	if _, ok := byPool(idx.Layouts())["karpenter.sh/nodepool=b/"+old.Fingerprint()]; ok {
		t.Fatal("a pool with a failed node must not be pinned by pool")
	}
	idx.Update(gputest.Node("b2", old, 4, func(n *corev1.Node) { inPool("b")(n); delete(n.Labels, layout.LabelState) }))
	if _, ok := byPool(idx.Layouts())["karpenter.sh/nodepool=b/"+old.Fingerprint()]; !ok {
		t.Fatal("a node not probed yet must not make its pool mixed")
	}
	// Nor does one where the probe found no NVIDIA device: no GPU pod can
	// land there.
	idx.Update(gputest.Node("b2", old, 0, func(n *corev1.Node) { inPool("b")(n); n.Labels[layout.LabelState] = layout.StateNoDriver }))
	if _, ok := byPool(idx.Layouts())["karpenter.sh/nodepool=b/"+old.Fingerprint()]; !ok {
		t.Fatal("a node without an NVIDIA device must not make its pool mixed")
	}

	// The pool's nodes leave: without memory, the pool is gone.
	idx.Delete("b1")
	idx.Delete("b2")
	for k := range byPool(idx.Layouts()) {
		if strings.HasPrefix(k, "karpenter.sh/nodepool=b/") {
			t.Fatalf("pool b has no node and no memory, but %s is offered", k)
		}
	}
}

func keysOf(m map[string]*inject.Layout) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestIndexRememberedPools(t *testing.T) {
	cfg := poolConfig(t, ", rememberFor: 48h")
	plan := gputest.Plan("535.104.05")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	idx := NewIndex(cfg, logr.Discard())
	clk := clocktesting.NewFakePassiveClock(now)
	idx.SetClock(clk)
	idx.Update(gputest.Node("a1", plan, 4, inPool("a")))
	idx.Update(gputest.Node("a2", plan, 4, func(n *corev1.Node) {
		inPool("a")(n)
		n.Labels["topology.kubernetes.io/zone"] = "us-east-1b"
	}))
	live := idx.LivePools(now)
	if len(live) != 1 {
		t.Fatalf("live pools = %+v", live)
	}
	m := live[0]
	if m.Pool != "karpenter.sh/nodepool=a" || m.NodeLabels["node.kubernetes.io/instance-type"] != "g4dn.xlarge" || m.NodeLabels[poolLabel] != "a" {
		t.Errorf("memory = %+v", m)
	}
	for _, k := range []string{"kubernetes.io/hostname", "topology.kubernetes.io/zone", layout.LabelState, layout.LabelFingerprint} {
		if _, ok := m.NodeLabels[k]; ok {
			t.Errorf("remembered node labels hold %s, which not every node has or which is per node: %v", k, m.NodeLabels)
		}
	}
	if len(m.Taints) != 1 || m.Taints[0].Key != "nvidia.com/gpu" {
		t.Errorf("remembered taints = %v", m.Taints)
	}

	// Round trip through the ConfigMap, as the writer and the readers do.
	data, err := pools.EncodeMemory(live)
	if err != nil {
		t.Fatal(err)
	}
	mem, errs := pools.DecodeMemory(data, cfg.Pinning.NodeLabels, cfg.Rules(), now)
	if len(errs) > 0 || len(mem) != 1 {
		t.Fatalf("decode: %v %v", mem, errs)
	}
	idx.SetMemory(mem)

	// While the pool has nodes, the memory is not used.
	for _, l := range idx.Layouts() {
		if l.Remembered != nil {
			t.Fatalf("remembered layout offered while the pool is live: %+v", l)
		}
	}
	idx.Delete("a1")
	idx.Delete("a2")
	var rem *inject.Layout
	for _, l := range idx.Layouts() {
		if l.Remembered != nil {
			rem = l
		}
	}
	if rem == nil || rem.Fingerprint != plan.Fingerprint() || rem.NodeSelector[poolLabel] != "a" || len(rem.Nodes) != 1 || rem.Nodes[0].Name != "" {
		t.Fatalf("pool at zero: remembered layout = %+v", rem)
	}

	// Two days later the memory has expired: the next reader sees it gone.
	now = now.Add(48 * time.Hour)
	clk.SetTime(now)
	for _, l := range idx.Layouts() {
		if l.Remembered != nil {
			t.Fatalf("expired memory still offered: %+v", l)
		}
	}
}

// TestIndexPoolsOfOneLayout: a pool at zero that memory vouches for joins
// the pin of the live pools of its layout, so that an autoscaler may grow it
// for a pod the live pool cannot take; pools at zero of one layout are one
// remembered choice; a pool of another layout stays apart.
func TestIndexPoolsOfOneLayout(t *testing.T) {
	cfg := poolConfig(t, ", rememberFor: 48h")
	plan, other := gputest.Plan("535.104.05"), gputest.Plan("580.65.06")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	idx := NewIndex(cfg, logr.Discard())
	clk := clocktesting.NewFakePassiveClock(now)
	idx.SetClock(clk)
	idx.Update(gputest.Node("od1", plan, 4, inPool("on-demand")))
	mem := func(pool string, p layout.Plan, seen time.Time) pools.Memory {
		labels := map[string]string{poolLabel: pool}
		return pools.Memory{Pool: pools.Key(labels, cfg.Pinning.NodeLabels), Labels: labels, NodeLabels: labels, Plan: p, LastSeen: seen}
	}
	idx.SetMemory([]pools.Memory{
		mem("spot", plan, now.Add(-time.Hour)), mem("spot-2", plan, now.Add(-2*time.Hour)), mem("next", other, now.Add(-time.Hour)),
	})
	ls := byPool(idx.Layouts())
	live := ls["karpenter.sh/nodepool=on-demand karpenter.sh/nodepool=spot karpenter.sh/nodepool=spot-2/"+plan.Fingerprint()]
	if live == nil || live.Remembered != nil || len(live.Nodes) != 1 || len(live.PoolLabels) != 3 || live.NodeSelector != nil {
		t.Fatalf("live pool with its remembered pools: %+v (layouts %v)", live, keysOf(ls))
	}
	zero := ls["karpenter.sh/nodepool=spot karpenter.sh/nodepool=spot-2/"+plan.Fingerprint()]
	if zero == nil || zero.Remembered == nil || len(zero.Nodes) != 2 || len(zero.PoolLabels) != 2 ||
		!zero.Remembered.LastSeen.Equal(now.Add(-time.Hour)) || !zero.Remembered.Until.Equal(now.Add(47*time.Hour)) {
		t.Fatalf("remembered pools of one layout: %+v (layouts %v)", zero, keysOf(ls))
	}
	if l := ls["karpenter.sh/nodepool=next/"+other.Fingerprint()]; l == nil || l.Remembered == nil || l.NodeSelector[poolLabel] != "next" {
		t.Fatalf("remembered pool of another layout: %+v (layouts %v)", l, keysOf(ls))
	}
	if len(ls) != 3 {
		t.Fatalf("layouts %v", keysOf(ls))
	}
	// spot-2 expires first: the pin forgets it, on the next reader's view.
	now = now.Add(46*time.Hour + time.Minute)
	clk.SetTime(now)
	ls = byPool(idx.Layouts())
	if l := ls["karpenter.sh/nodepool=on-demand karpenter.sh/nodepool=spot/"+plan.Fingerprint()]; l == nil {
		t.Fatalf("after spot-2 expired: layouts %v", keysOf(ls))
	}
}

func TestNextMemory(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	mk := func(pool, version string, seen time.Time) pools.Memory {
		return pools.Memory{Pool: pool, Labels: map[string]string{poolLabel: pool}, Plan: gputest.Plan(version), LastSeen: seen}
	}
	stored := []pools.Memory{mk("a", "535.104.05", now.Add(-10*time.Minute)), mk("gone", "535.104.05", now.Add(-47*time.Hour)), mk("expired", "535.104.05", now.Add(-49*time.Hour))}
	live := []pools.Memory{mk("a", "535.104.05", now), mk("new", "580.65.06", now)}
	next, changed := NextMemory(stored, live, now, 48*time.Hour, time.Hour)
	if !changed {
		t.Fatal("a new pool and an expired one must change the memory")
	}
	got := map[string]pools.Memory{}
	for _, m := range next {
		got[m.Pool] = m
	}
	if len(got) != 3 || !got["a"].LastSeen.Equal(now.Add(-10*time.Minute)) || !got["new"].LastSeen.Equal(now) || got["gone"].Pool == "" {
		t.Fatalf("next = %+v", next)
	}
	// Steady: nothing to write.
	if _, changed := NextMemory(next, live[:1], now.Add(time.Minute), 48*time.Hour, time.Hour); changed {
		// "new" is not live any more but not expired; "a" is fresh.
		t.Fatal("a steady pool must not be rewritten before refresh")
	}
	// A driver upgrade of a live pool is written at once.
	if _, changed := NextMemory(next, []pools.Memory{mk("a", "580.65.06", now)}, now, 48*time.Hour, time.Hour); !changed {
		t.Fatal("a pool's new layout must be written at once")
	}
	// After refresh, lastSeen is renewed.
	if _, changed := NextMemory(next, live[:1], now.Add(2*time.Hour), 48*time.Hour, time.Hour); !changed {
		t.Fatal("lastSeen must be renewed after refresh")
	}
}

func TestMismatchEvent(t *testing.T) {
	cfg := poolConfig(t, "")
	old, neu := gputest.Plan("535.104.05"), gputest.Plan("580.65.06")
	idx := NewIndex(cfg, logr.Discard())
	idx.Update(gputest.Node("a1", neu, 4, inPool("a")))
	idx.Update(gputest.Node("fresh", neu, 4, func(n *corev1.Node) {
		inPool("a")(n)
		delete(n.Labels, layout.LabelFingerprint)
		delete(n.Annotations, layout.AnnotationLayout)
		delete(n.Labels, layout.LabelState)
	}))
	rec := record.NewFakeRecorder(10)
	m := NewMismatches(idx, rec, logr.Discard())
	pod := func(uid, node, fp string) *corev1.Pod {
		p := &corev1.Pod{}
		p.Name, p.Namespace, p.UID, p.Spec.NodeName = "train-"+uid, "ml", types.UID(uid), node
		p.Labels = map[string]string{layout.LabelPinnedLayout: fp}
		p.Annotations = map[string]string{layout.AnnotationInjected: layout.Injected{Fingerprint: fp, DriverVersion: "535.104.05", Pool: "karpenter.sh/nodepool=a", Remembered: true}.String()}
		return p
	}
	m.Check(pod("1", "a1", neu.Fingerprint()))    // same layout: nothing
	m.Check(pod("2", "", old.Fingerprint()))      // not bound yet
	m.Check(pod("3", "fresh", old.Fingerprint())) // node not probed yet
	if len(rec.Events) != 0 {
		t.Fatalf("unexpected event: %s", <-rec.Events)
	}
	p := pod("4", "a1", old.Fingerprint())
	m.Check(p)
	m.Check(p) // once per pod
	if len(rec.Events) != 1 {
		t.Fatalf("want one event, got %d", len(rec.Events))
	}
	ev := <-rec.Events
	for _, want := range []string{"Warning", pools.ReasonLayoutMismatch, old.Fingerprint(), "driver 535.104.05", "memory", "node a1 of pool karpenter.sh/nodepool=a", neu.Fingerprint(), "driver 580.65.06", "Delete the pod"} {
		if !strings.Contains(ev, want) {
			t.Errorf("event %q lacks %q", ev, want)
		}
	}
}

func TestMemorySync(t *testing.T) {
	cfg := poolConfig(t, "")
	plan := gputest.Plan("535.104.05")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	idx := NewIndex(cfg, logr.Discard())
	if err := NewNodeStore(idx).Replace([]any{gputest.Node("a1", plan, 4, inPool("a"))}, "1"); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().Build()
	m := NewMemory(cfg, idx, c, "gpu-injector", "gpu-injector-pools", logr.Discard())
	clk := clocktesting.NewFakePassiveClock(now)
	m.Clock = clk
	ctx := context.Background()
	get := func() *corev1.ConfigMap {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "gpu-injector", Name: "gpu-injector-pools"}, cm); err != nil {
			t.Fatal(err)
		}
		return cm
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := get()
	mem, errs := pools.DecodeMemory(first.Data, cfg.Pinning.NodeLabels, cfg.Rules(), now)
	if len(errs) > 0 || len(mem) != 1 || mem[0].Pool != "karpenter.sh/nodepool=a" || !mem[0].LastSeen.Equal(now) {
		t.Fatalf("memory after the first sync: %+v %v", mem, errs)
	}
	// Steady: no write.
	now = now.Add(time.Minute)
	clk.SetTime(now)
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if get().ResourceVersion != first.ResourceVersion {
		t.Error("a steady pool was written again before its refresh")
	}
	// The pool leaves: its entry stays until it expires, then goes.
	idx.Delete("a1")
	now = now.Add(cfg.Pinning.Remember() - 2*time.Minute)
	clk.SetTime(now)
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(get().Data) != 1 {
		t.Fatal("a pool at zero was forgotten before rememberFor")
	}
	now = now.Add(2 * time.Minute)
	clk.SetTime(now)
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if d := get().Data; len(d) != 0 {
		t.Fatalf("an expired pool is still remembered: %v", d)
	}
	// Garbage someone wrote is dropped at the next write.
	cm := get()
	cm.Data = map[string]string{"pool-junk": "{"}
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if d := get().Data; len(d) != 0 {
		t.Fatalf("a broken entry survived a write: %v", d)
	}
}

// TestIndexDeclaredPools: a declared pool serves its pods while it has no
// node and nothing is remembered of it, whatever the day; its nodes' layout,
// live or remembered, comes first.
func TestIndexDeclaredPools(t *testing.T) {
	cfg := poolConfig(t, ", rememberFor: 48h")
	declaredA, declaredB, published := gputest.Plan("535.104.05"), gputest.Plan("550.54.15"), gputest.Plan("580.65.06")
	for pool, plan := range map[string]layout.Plan{"a": declaredA, "b": declaredB} {
		text, err := layout.Encode(plan)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Pinning.Pools = append(cfg.Pinning.Pools, config.DeclaredPool{
			Pool:       map[string]string{poolLabel: pool},
			NodeLabels: map[string]string{"node.kubernetes.io/instance-type": "g4dn.xlarge"},
			Taints:     []config.PoolTaint{{Key: "nvidia.com/gpu", Effect: "NoSchedule"}},
			Layout:     text,
		})
	}
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(now)
	idx := NewIndex(cfg, logr.Discard())
	idx.SetClock(clk)
	served := func() map[string]*inject.Layout {
		t.Helper()
		out := map[string]*inject.Layout{}
		for _, l := range idx.Layouts() {
			if l.Remembered != nil {
				out[l.Pool] = l
			}
		}
		return out
	}

	// No node, no memory: each pool from its declaration, with the labels
	// and taints of its template, and pinned by the pool's labels.
	got := served()
	a, b := got["karpenter.sh/nodepool=a"], got["karpenter.sh/nodepool=b"]
	if len(got) != 2 || a == nil || b == nil {
		t.Fatalf("declared layouts = %v", keysOf(got))
	}
	if a.Fingerprint != declaredA.Fingerprint() || !a.Remembered.LastSeen.IsZero() || len(a.Remembered.Declared) != 1 || a.NodeSelector[poolLabel] != "a" {
		t.Errorf("pool a = %+v %+v", a, a.Remembered)
	}
	if n := a.Nodes[0]; n.Labels.Map()["node.kubernetes.io/instance-type"] != "g4dn.xlarge" || len(n.Taints) != 1 {
		t.Errorf("pool a's next node = %+v", n)
	}

	// A declaration never expires.
	now = now.AddDate(1, 0, 0)
	clk.SetTime(now)
	if got := served(); len(got) != 2 {
		t.Fatalf("a year later: declared layouts = %v", keysOf(got))
	}

	// A node of pool a publishes: a is live, and no longer declared.
	idx.Update(gputest.Node("a1", published, 4, inPool("a")))
	if got := served(); len(got) != 1 || got["karpenter.sh/nodepool=b"] == nil {
		t.Fatalf("with a node in pool a: declared layouts = %v", keysOf(got))
	}

	// Pool b remembered with another layout: its memory comes first, until
	// it expires.
	idx.SetMemory([]pools.Memory{{Pool: "karpenter.sh/nodepool=b", Labels: map[string]string{poolLabel: "b"}, NodeLabels: map[string]string{poolLabel: "b"}, Plan: published, LastSeen: now}})
	got = served()
	if b := got["karpenter.sh/nodepool=b"]; len(got) != 1 || b == nil || b.Fingerprint != published.Fingerprint() || len(b.Remembered.Declared) != 0 {
		t.Fatalf("pool b remembered: %v", got)
	}
	now = now.Add(48 * time.Hour)
	clk.SetTime(now)
	got = served()
	if b := got["karpenter.sh/nodepool=b"]; len(got) != 1 || b == nil || b.Fingerprint != declaredB.Fingerprint() {
		t.Fatalf("pool b's memory expired: %v", got)
	}
}
