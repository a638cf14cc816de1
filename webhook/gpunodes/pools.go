package gpunodes

import (
	"maps"
	"slices"
	"strings"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// poolState is the pool view of the index: each member node's fingerprint,
// or a rejectedMember value when the node is ready but its layout is not.
type poolState struct {
	labels  map[string]string
	members map[string]string
	// counts is how many members have each value, so that uniformity is
	// known without a scan.
	counts map[string]int
}

func (ps *poolState) add(name, value string) {
	ps.members[name] = value
	ps.counts[value]++
}

func (ps *poolState) remove(name string) {
	v, ok := ps.members[name]
	if !ok {
		return
	}
	delete(ps.members, name)
	if ps.counts[v]--; ps.counts[v] == 0 {
		delete(ps.counts, v)
	}
}

// rejectedMember marks a ready node whose probe failed or whose layout was
// rejected: a pod pinned by the pool could land there, so the pool is mixed.
const rejectedMember = "!"

// uniform returns the one fingerprint every member publishes.
func (ps *poolState) uniform() (string, bool) {
	if len(ps.counts) != 1 {
		return "", false
	}
	for v := range ps.counts {
		return v, v != rejectedMember
	}
	return "", false
}

// perNodeLabels differ from node to node by design, so they never describe a
// pool; the project's own keys are the probe's, set after a node joined.
var perNodeLabels = []string{corev1.LabelHostname, "node.kubernetes.io/instance-id", "karpenter.sh/nodeclaim"}

// poolMember reports whether a node is a member of its pool: ready,
// schedulable and probed. A node that just joined is not probed yet, and
// says nothing either way.
func poolMember(f *nodeFacts) bool {
	return f.ready && !f.unschedulable && f.state != ""
}

// poolValue is a member's value in its pool: its fingerprint, or
// rejectedMember.
func (st *nodeState) poolValue() string {
	if st.fingerprint != "" {
		return st.fingerprint
	}
	return rejectedMember
}

// poolKey is the node's pool key, "" for none.
func (st *nodeState) poolKey() string {
	if st.pool == (unique.Handle[string]{}) {
		return ""
	}
	return st.pool.Value()
}

// setPoolMember records a node's place in the pool view; it reports whether
// the view changed.
func (idx *Index) setPoolMember(name string, old, st *nodeState, f *nodeFacts) bool {
	if !idx.cfg.Pinning.ByPool() {
		return false
	}
	if f != nil {
		st.isMember = poolMember(f)
	}
	if old != nil && st != nil && old.pool == st.pool && old.isMember == st.isMember && (!st.isMember || old.poolValue() == st.poolValue()) {
		return false
	}
	if old != nil && old.isMember {
		if key := old.poolKey(); key != "" {
			ps := idx.pools[key]
			ps.remove(name)
			if len(ps.members) == 0 {
				delete(idx.pools, key)
			}
		}
	}
	if st != nil && st.isMember {
		if key := st.poolKey(); key != "" {
			ps := idx.pools[key]
			if ps == nil {
				labels := make(map[string]string, len(idx.cfg.Pinning.NodeLabels))
				for _, k := range idx.cfg.Pinning.NodeLabels {
					labels[k] = st.info.Labels.Get(k)
				}
				ps = &poolState{labels: labels, members: map[string]string{}, counts: map[string]int{}}
				idx.pools[key] = ps
			}
			ps.add(name, st.poolValue())
		}
	}
	return (old != nil && old.isMember) || (st != nil && st.isMember)
}

// NodeReady reports the kubelet's Ready condition: only a Ready node lends
// its layout to the index.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// SetMemory replaces the remembered pool layouts (already validated) and
// publishes a new snapshot.
func (idx *Index) SetMemory(mem []pools.Memory) {
	m := make(map[string]pools.Memory, len(mem))
	for _, e := range mem {
		m[e.Pool] = e
	}
	idx.mu.Lock()
	defer idx.mu.Unlock()
	idx.memory = m
	idx.publish(nil)
}

// withPools turns the fingerprint layouts into the pool view: the nodes of
// the uniform pools of one layout become one layout pinned by those pools'
// labels (with the layout's remembered pools at zero), the others stay
// pinned by fingerprint, and pools with no member node are served from
// memory, one layout each, until they expire. It returns the earliest expiry it relied on.
func (idx *Index) withPools(byFP []*inject.Layout, now time.Time) ([]*inject.Layout, time.Time) {
	uniform, mixed := idx.poolStates()
	remembered, next := idx.rememberedPools(now)
	// The split of a fingerprint's nodes depends only on its Layout (a new
	// one is published on every change of its nodes) and on the pools'
	// states: reuse it while both are unchanged, so that one node's event
	// rebuilds one layout's view, not every node's.
	sig := poolSignature(uniform, mixed, remembered)
	views := make(map[string]poolView, len(byFP))
	out := make([]*inject.Layout, 0, len(byFP)+len(uniform)+len(idx.memory))
	for _, l := range byFP {
		if v, ok := idx.poolViews[l.Fingerprint]; ok && v.src == l && v.sig == sig {
			views[l.Fingerprint] = v
			out = append(out, v.out...)
			continue
		}
		first := len(out)
		out = idx.splitByPool(out, l, uniform, mixed, remembered[l.Fingerprint])
		views[l.Fingerprint] = poolView{src: l, sig: sig, out: slices.Clone(out[first:])}
	}
	idx.poolViews = views
	for fp, mems := range remembered {
		out = append(out, idx.rememberedLayout(fp, mems))
	}
	idx.countPoolLayouts(mixed, remembered)
	slices.SortFunc(out, func(a, b *inject.Layout) int {
		if c := strings.Compare(a.Fingerprint, b.Fingerprint); c != 0 {
			return c
		}
		return strings.Compare(a.Pool, b.Pool)
	})
	return out, next
}

// poolStates sorts the pools into the uniform ones, by the one fingerprint
// of their nodes, and the mixed ones.
func (idx *Index) poolStates() (uniform map[string]string, mixed map[string]bool) {
	uniform, mixed = map[string]string{}, map[string]bool{}
	for key, ps := range idx.pools {
		if fp, ok := ps.uniform(); ok {
			uniform[key] = fp
		} else {
			mixed[key] = true
		}
	}
	return uniform, mixed
}

// splitByPool appends to out the pool view of one fingerprint's Layout l:
// the nodes of the pools uniform in l's fingerprint as one layout pinned by
// those pools (and by remembered, its pools at zero), the other nodes as one
// layout pinned by fingerprint, which names the mixed pools among them.
func (idx *Index) splitByPool(out []*inject.Layout, l *inject.Layout, uniform map[string]string, mixed map[string]bool, remembered []pools.Memory) []*inject.Layout {
	var pooled, rest []*inject.NodeInfo
	var pooledGPUs, restGPUs int64
	var keys, mixedHere []string
	for _, n := range l.Nodes {
		key := n.Pool
		if key != "" && uniform[key] == l.Fingerprint {
			pooled = append(pooled, n)
			pooledGPUs += n.AllocatableGPUs
			if !slices.Contains(keys, key) {
				keys = append(keys, key)
			}
			continue
		}
		rest = append(rest, n)
		restGPUs += n.AllocatableGPUs
		if mixed[key] && !slices.Contains(mixedHere, key) {
			mixedHere = append(mixedHere, key)
		}
	}
	if len(rest) > 0 {
		slices.Sort(mixedHere)
		out = append(out, &inject.Layout{Fingerprint: l.Fingerprint, Plan: l.Plan, AllocatableGPUs: restGPUs, Nodes: rest, MixedPools: mixedHere})
	}
	if len(pooled) > 0 {
		// The pools of this layout at zero that memory still vouches
		// for are in the pin too: the pod may wait for either to grow.
		for _, m := range remembered {
			keys = append(keys, m.Pool)
		}
		pl := &inject.Layout{Fingerprint: l.Fingerprint, Plan: l.Plan, AllocatableGPUs: pooledGPUs, Nodes: pooled}
		idx.pinPools(pl, keys)
		out = append(out, pl)
	}
	return out
}

// countPoolLayouts sets the pool layouts gauge: every pool live or mixed,
// and every pool served from memory or its declaration.
func (idx *Index) countPoolLayouts(mixed map[string]bool, remembered map[string][]pools.Memory) {
	poolLayouts.Reset()
	for key := range idx.pools {
		state := "live"
		if mixed[key] {
			state = "mixed"
		}
		poolLayouts.WithLabelValues(key, state).Set(1)
	}
	for _, mems := range remembered {
		for _, m := range mems {
			state := "remembered"
			if m.Declared {
				state = "declared"
			}
			poolLayouts.WithLabelValues(m.Pool, state).Set(1)
		}
	}
}

// poolView is the pool view of one fingerprint's Layout, as last built.
type poolView struct {
	src *inject.Layout
	sig string
	out []*inject.Layout
}

// poolSignature sums up the pools' states: each uniform pool's layout, each
// mixed pool and each remembered one.
func poolSignature(uniform map[string]string, mixed map[string]bool, remembered map[string][]pools.Memory) string {
	keys := make([]string, 0, len(uniform)+len(mixed))
	for k, fp := range uniform {
		keys = append(keys, k+"\x00"+fp)
	}
	for k := range mixed {
		keys = append(keys, k+"\x00!")
	}
	for fp, mems := range remembered {
		for _, m := range mems {
			keys = append(keys, m.Pool+"\x00?"+fp)
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, "\x01")
}

// rememberedPools are the remembered and declared pools with no live member,
// the remembered ones not yet expired at now, by fingerprint and sorted by
// pool, and the earliest expiry among them. A pool's memory comes before its
// declaration: it is what its nodes published.
func (idx *Index) rememberedPools(now time.Time) (map[string][]pools.Memory, time.Time) {
	var next time.Time
	remember := idx.cfg.Pinning.Remember()
	out := map[string][]pools.Memory{}
	for key, m := range idx.memory {
		if _, live := idx.pools[key]; live {
			continue
		}
		until := m.LastSeen.Add(remember)
		if !now.Before(until) {
			continue
		}
		if next.IsZero() || until.Before(next) {
			next = until
		}
		fp := m.Plan.Fingerprint()
		out[fp] = append(out[fp], m)
	}
	for key, m := range idx.declared {
		if _, live := idx.pools[key]; live {
			continue
		}
		if r, ok := idx.memory[key]; ok && now.Before(r.LastSeen.Add(remember)) {
			continue
		}
		fp := m.Plan.Fingerprint()
		out[fp] = append(out[fp], m)
	}
	for _, mems := range out {
		slices.SortFunc(mems, func(a, b pools.Memory) int { return strings.Compare(a.Pool, b.Pool) })
	}
	return out, next
}

// rememberedLayout serves the pools of one layout that have no node from
// memory and declarations: one node stands for each pool's next one, and
// the pin names them all. It is remembered until the last remembered one
// expires, and for as long as one of them is declared.
func (idx *Index) rememberedLayout(fp string, mems []pools.Memory) *inject.Layout {
	remember := idx.cfg.Pinning.Remember()
	l := &inject.Layout{Fingerprint: fp, Plan: mems[0].Plan, Remembered: &inject.Remembered{}}
	keys := make([]string, 0, len(mems))
	for _, m := range mems {
		l.Nodes = append(l.Nodes, &inject.NodeInfo{Labels: inject.NewLabels(m.NodeLabels), Taints: m.Taints})
		keys = append(keys, m.Pool)
		if m.Declared {
			l.Remembered.Declared = append(l.Remembered.Declared, m.Pool)
			continue
		}
		if m.LastSeen.After(l.Remembered.LastSeen) {
			l.Remembered.LastSeen, l.Remembered.Until = m.LastSeen, m.LastSeen.Add(remember)
		}
	}
	idx.pinPools(l, keys)
	return l
}

// pinPools pins l to the pools of keys: by one pool's labels as a node
// selector, or by a node affinity over several.
func (idx *Index) pinPools(l *inject.Layout, keys []string) {
	l.Pool = pools.Join(keys)
	for _, key := range pools.Split(l.Pool) {
		labels := idx.poolLabels(key)
		if labels == nil {
			continue
		}
		l.PoolLabels = append(l.PoolLabels, labels)
	}
	if len(l.PoolLabels) == 1 {
		l.NodeSelector = l.PoolLabels[0]
	}
}

// poolLabels are the labels of a live, remembered or declared pool.
func (idx *Index) poolLabels(key string) map[string]string {
	if ps := idx.pools[key]; ps != nil {
		return ps.labels
	}
	if m, ok := idx.memory[key]; ok {
		return m.Labels
	}
	if m, ok := idx.declared[key]; ok {
		return m.Labels
	}
	return nil
}

// LivePools returns what the memory should hold of each pool whose ready
// nodes all publish one layout now, as seen at now.
func (idx *Index) LivePools(now time.Time) []pools.Memory {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	var out []pools.Memory
	for key, ps := range idx.pools {
		fp, ok := ps.uniform()
		if !ok {
			continue
		}
		ls := idx.layouts[fp]
		if ls == nil {
			continue
		}
		var common map[string]string
		var taints []corev1.Taint
		first := true
		for name := range ps.members {
			info := idx.nodes[name].info
			if first {
				common = info.Labels.Map()
				taints = slices.Clone(info.Taints)
				first = false
				continue
			}
			maps.DeleteFunc(common, func(k, v string) bool { w, ok := info.Labels.Lookup(k); return !ok || w != v })
			taints = slices.DeleteFunc(taints, func(t corev1.Taint) bool {
				return !slices.ContainsFunc(info.Taints, func(u corev1.Taint) bool { return t.MatchTaint(&u) && t.Value == u.Value })
			})
		}
		maps.DeleteFunc(common, func(k, _ string) bool {
			return slices.Contains(perNodeLabels, k) || strings.HasPrefix(k, layout.Prefix)
		})
		for i := range taints {
			taints[i].TimeAdded = nil
		}
		out = append(out, pools.Memory{Pool: key, Labels: maps.Clone(ps.labels), NodeLabels: common, Taints: taints, Plan: ls.plan, LastSeen: now})
	}
	slices.SortFunc(out, func(a, b pools.Memory) int { return strings.Compare(a.Pool, b.Pool) })
	return out
}
