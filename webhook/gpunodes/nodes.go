// Package gpunodes is the cluster's GPU nodes as the webhook sees them: an
// index of the Nodes (their published driver layouts, labels, taints and GPU
// resources), the GPUs DRA ResourceSlices publish, the pools that pinning by
// node labels groups them in and the memory of pools at zero, and the Events
// for pods that landed on a node of another layout. It hands the injection
// (package inject) its candidates: the Layouts and the wedged nodes.
package gpunodes

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// Index holds the driver layouts that ready GPU nodes publish, grouped by
// fingerprint. Writers (watch events) serialise on a mutex and publish an
// immutable snapshot; readers (admission requests) load it without locks.
type Index struct {
	cfg   *config.Configuration
	rules layout.Rules
	log   logr.Logger

	mu      sync.Mutex
	nodes   map[string]*nodeState
	layouts map[string]*layoutState
	// pools and memory are the pool view, with pinning.nodeLabels only.
	pools  map[string]*poolState
	memory map[string]pools.Memory
	// declared are the configuration's pools, served where neither a node
	// nor memory is.
	declared  map[string]pools.Memory
	poolViews map[string]poolView
	clock     clock.PassiveClock
	// draGPUs are the GPUs that DRA ResourceSlices publish per node, which a
	// Node's allocatable does not list (SetDRAGPUs).
	draGPUs map[string]int64

	// wedged are the nodes whose driver is wedged; wedgedSnap is them as a
	// sorted slice, published like snapshot.
	wedged     map[string]*inject.WedgedNode
	wedgedSnap atomic.Pointer[[]*inject.WedgedNode]

	snapshot atomic.Pointer[[]*inject.Layout]
	// listed is set once the index holds every Node of the first list.
	listed atomic.Bool

	// expires is when a remembered layout in the snapshot expires (Unix
	// nanoseconds, 0 for none): the next reader after it publishes anew.
	expires atomic.Int64
}

// nodeState is what the index remembers of one Node between events. It is
// kept for every GPU node, so it holds no string of its own: its strings are
// the interned labels' and its pool key is interned.
type nodeState struct {
	info *inject.NodeInfo
	// ownGPUs are the GPUs of the node's allocatable, before DRA's are
	// added: info's sum is capped, so it cannot be taken apart again.
	ownGPUs int64
	// fingerprint is the layout the node is a candidate of; empty if none.
	fingerprint string
	// source is the annotation and fingerprint label last seen, so an
	// unchanged value is neither decoded again nor logged and counted again.
	source layoutSource
	// wedged is set while the node is ready and schedulable but its probe
	// marks the driver wedged.
	wedged *inject.WedgedNode
	// pool is the node's pool key (info.Pool), zero for none: the handle
	// keeps the one copy of the key that the pool's nodes share.
	pool unique.Handle[string]
	// isMember is set when the node is a member of its pool (ready and
	// probed); its value there is poolValue.
	isMember bool
	// rejected is set when source was rejected (and logged and counted).
	rejected bool
}

// layoutSource is what a node publishes about its layout. The annotation,
// a few KiB that every node of a pool publishes byte for byte, is interned:
// one copy per distinct value, compared as a pointer.
type layoutSource struct {
	annotation unique.Handle[string]
	label      string
}

// layoutState is one fingerprint's plan and its nodes, sorted by name.
type layoutState struct {
	plan   layout.Plan
	source layoutSource
	nodes  []*inject.NodeInfo
	gpus   int64
	latest *inject.Layout
}

// NewIndex returns an empty index that checks layouts against cfg.
func NewIndex(cfg *config.Configuration, log logr.Logger) *Index {
	idx := &Index{
		cfg:     cfg,
		rules:   cfg.Rules(),
		log:     log,
		nodes:   map[string]*nodeState{},
		layouts: map[string]*layoutState{},
		pools:   map[string]*poolState{},
		clock:   wallclock.Real(),
		draGPUs: map[string]int64{},
		wedged:  map[string]*inject.WedgedNode{},
	}
	declared := cfg.DeclaredPools()
	idx.declared = make(map[string]pools.Memory, len(declared))
	for _, m := range declared {
		idx.declared[m.Pool] = m
	}
	empty := []*inject.Layout{}
	idx.snapshot.Store(&empty)
	noWedged := []*inject.WedgedNode{}
	idx.wedgedSnap.Store(&noWedged)
	if len(idx.declared) > 0 {
		// Served before the first node is listed: a cluster whose pools
		// are all at zero may never list one.
		idx.publish(nil)
	}
	return idx
}

// SetClock replaces the clock that remembered pools are aged against.
func (idx *Index) SetClock(c clock.PassiveClock) { idx.clock = c }

// Wedged returns the ready, schedulable nodes whose driver is wedged, sorted
// by name. The slice is shared and must not be changed.
func (idx *Index) Wedged() []*inject.WedgedNode { return *idx.wedgedSnap.Load() }

// Layouts returns the current candidate layouts, sorted by fingerprint. The
// slice and everything it points to are shared and must not be changed.
func (idx *Index) Layouts() []*inject.Layout {
	if exp := idx.expires.Load(); exp != 0 && idx.clock.Now().UnixNano() >= exp {
		idx.mu.Lock()
		if exp := idx.expires.Load(); exp != 0 && idx.clock.Now().UnixNano() >= exp {
			idx.publish(nil)
		}
		idx.mu.Unlock()
	}
	return *idx.snapshot.Load()
}

// Ready reports whether the index has seen every Node of the initial list.
func (idx *Index) Ready() bool { return idx.listed.Load() }

// ReadyCheck is a healthz checker for /readyz.
func (idx *Index) ReadyCheck(_ *http.Request) error {
	if !idx.Ready() {
		return fmt.Errorf("node index has not synced yet")
	}
	return nil
}

// Add records a Node; it is Update under the name informers use.
func (idx *Index) Add(n *corev1.Node) { idx.Update(n) }

// Update records the current state of a Node. It keeps nothing of n that
// the caller may change later.
func (idx *Index) Update(n *corev1.Node) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	f := idx.factsOf(n, idx.nodes[n.Name], idx.draGPUs[n.Name])
	idx.record(&f, b)
	idx.flush(b)
}

// updateFacts records a node that Transform read while it streamed.
func (idx *Index) updateFacts(f *nodeFacts) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	idx.record(f, b)
	idx.flush(b)
}

// Replace records a full list of Nodes: every Node in it, and forgets those
// not in it. It publishes once for the whole list, where Update publishes
// once per Node and copies its layout's node list each time.
func (idx *Index) Replace(nodes []*corev1.Node) {
	list := make([]any, len(nodes))
	for i, n := range nodes {
		list[i] = n
	}
	if err := idx.replace(list); err != nil {
		// Only a nil Node gets here.
		panic(err)
	}
}

// replace is Replace of a list as a reflector hands it over: Nodes that
// Transform read while they streamed (streamedNode), or whole Nodes of a
// list that was not streamed. A list of anything else changes nothing.
func (idx *Index) replace(list []any) error {
	for _, obj := range list {
		if _, ok := nodeName(obj); !ok {
			return fmt.Errorf("failed to record a node: got %T", obj)
		}
	}
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	seen := make(map[string]struct{}, len(list))
	for _, obj := range list {
		var f *nodeFacts
		switch o := obj.(type) {
		case *streamedNode:
			f = &o.nodeFacts
		case *corev1.Node:
			facts := idx.factsOf(o, idx.nodes[o.Name], idx.draGPUs[o.Name])
			f = &facts
		}
		seen[f.info.Name] = struct{}{}
		idx.record(f, b)
	}
	for name := range idx.nodes {
		if _, ok := seen[name]; !ok {
			idx.forget(name, b)
		}
	}
	idx.flush(b)
	return nil
}

// batch holds the changes of one or more Nodes, published together: the
// fingerprints whose nodes changed, and those whose node list the batch made
// itself (not published yet, so changed in place rather than copied).
type batch struct {
	changed map[string]bool
	owned   map[string]bool
	publish bool
	// wedged is set when a node became, stopped being or changed as a
	// wedged node.
	wedged bool
}

func newBatch() *batch { return &batch{changed: map[string]bool{}, owned: map[string]bool{}} }

func (idx *Index) flush(b *batch) {
	if b.publish || len(b.changed) > 0 {
		idx.publish(slices.Collect(maps.Keys(b.changed)))
	}
	if b.wedged {
		snap := slices.SortedFunc(maps.Values(idx.wedged), func(a, b *inject.WedgedNode) int { return strings.Compare(a.Node.Name, b.Node.Name) })
		idx.wedgedSnap.Store(&snap)
		wedgedNodes.Set(float64(len(snap)))
	}
}

// record is Update of a node's facts under idx.mu, publishing through b.
// It changes nothing that f points to: a streamed list's facts may be
// recorded by more than one index (benchmarks do).
func (idx *Index) record(f *nodeFacts, b *batch) {
	name := f.info.Name
	if !f.selected {
		// As the API server does for a watch: a node that stops matching
		// ProbedNodes is deleted.
		idx.forget(name, b)
		return
	}
	old := idx.nodes[name]
	info := f.info
	if dra := idx.draGPUs[name]; dra != f.dra {
		// Read while streamed, without the index's lock: add the DRA GPUs
		// the index knows of now.
		c := *info
		c.AllocatableGPUs = min(f.own+dra, MaxNodeGPUs)
		c.GPUs = c.GPUs.WithDRA(dra)
		info = &c
	}
	st := &nodeState{info: info, ownGPUs: f.own, source: f.source, pool: f.pool}
	if f.eligible() {
		switch {
		case old != nil && old.source == f.source && old.rejected:
			// Same rejected value as before: already logged and counted.
			st.rejected = true
		case old != nil && old.source == f.source && old.fingerprint != "":
			st.fingerprint = old.fingerprint
		default:
			idx.admit(f, st)
		}
	}
	idx.nodes[name] = st
	idx.recordWedged(f, info, old, st, b)
	poolChanged := idx.setPoolMember(name, old, st, f)

	oldFP := ""
	if old != nil {
		oldFP = old.fingerprint
		if oldFP == st.fingerprint && (oldFP == "" || infoEqual(old.info, info)) {
			// Keep the published NodeInfo: its layout's nodes are unchanged.
			if oldFP != "" {
				st.info = old.info
			}
			b.publish = b.publish || poolChanged
			return
		}
	}
	b.publish = true
	if oldFP != "" && oldFP != st.fingerprint {
		idx.removeNode(oldFP, name, b)
	}
	if st.fingerprint != "" {
		idx.putNode(st.fingerprint, info, b)
	}
}

// SetDRAGPUs records how many GPUs DRA ResourceSlices publish for a node;
// they add to its allocatable GPUs, which on a node whose GPUs come through
// DRA list none. The node may not be known yet: its next Update adds them.
func (idx *Index) SetDRAGPUs(name string, gpus int64) {
	gpus = max(min(gpus, MaxNodeGPUs), 0)
	idx.mu.Lock()
	defer idx.mu.Unlock()
	old := idx.draGPUs[name]
	if old == gpus {
		return
	}
	if gpus == 0 {
		delete(idx.draGPUs, name)
	} else {
		idx.draGPUs[name] = gpus
	}
	st, ok := idx.nodes[name]
	if !ok {
		return
	}
	// Published NodeInfos never change: replace this one.
	info := *st.info
	info.AllocatableGPUs = min(st.ownGPUs+gpus, MaxNodeGPUs)
	info.GPUs = info.GPUs.WithDRA(gpus)
	st.info = &info
	if st.fingerprint != "" {
		b := newBatch()
		idx.putNode(st.fingerprint, &info, b)
		idx.flush(b)
	}
}

// Delete forgets a Node.
func (idx *Index) Delete(name string) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	idx.forget(name, b)
	idx.flush(b)
}

// forget is Delete under idx.mu, publishing through b.
func (idx *Index) forget(name string, b *batch) {
	old, ok := idx.nodes[name]
	if !ok {
		return
	}
	delete(idx.nodes, name)
	if old.wedged != nil {
		delete(idx.wedged, name)
		b.wedged = true
	}
	if idx.setPoolMember(name, old, nil, nil) {
		b.publish = true
	}
	if old.fingerprint != "" {
		idx.removeNode(old.fingerprint, name, b)
	}
}

// recordWedged keeps st.wedged and idx.wedged in step with f: a node that
// is ready and schedulable but wedged. An event that changes nothing of it (a
// heartbeat) keeps the published WedgedNode.
func (idx *Index) recordWedged(f *nodeFacts, info *inject.NodeInfo, old, st *nodeState, b *batch) {
	name := info.Name
	if !f.wedged() {
		if old != nil && old.wedged != nil {
			delete(idx.wedged, name)
			b.wedged = true
		}
		return
	}
	if old != nil && old.wedged != nil && old.wedged.Reason == f.reason && infoEqual(old.wedged.Node, info) {
		st.wedged = old.wedged
		return
	}
	st.wedged = &inject.WedgedNode{Node: info, Reason: f.reason}
	idx.wedged[name] = st.wedged
	b.wedged = true
}

// maxReasonBytes bounds the state-reason a denial quotes: enough for the
// probe's messages (about 150 bytes), short enough that a node cannot fill a
// user's error with text of its choosing.
const maxReasonBytes = 300

// cleanReason makes a node's state-reason fit for a denial message: one
// line of printable text, at most maxReasonBytes, cut between characters.
func cleanReason(s string) string {
	if s == "" {
		return "no reason given"
	}
	return layout.OneLine(s, maxReasonBytes)
}

// admit checks a ready node's published layout, setting st.fingerprint or
// st.rejection. A layout already known under the same source is not decoded
// again: one decode per fingerprint, not per node.
func (idx *Index) admit(f *nodeFacts, st *nodeState) {
	label := st.source.label
	if ls, ok := idx.layouts[label]; ok && ls.source == st.source {
		st.fingerprint = label
		return
	}
	plan, reason, err := CheckPublished(st.source.annotation.Value(), f.hasLayout, label, idx.rules)
	if err != nil {
		st.rejected = true
		layoutsRejected.WithLabelValues(reason).Inc()
		idx.log.Info("ignoring the layout published by node", "node", f.info.Name, "reason", reason, "error", err.Error())
		return
	}
	st.fingerprint = label
	if _, ok := idx.layouts[label]; !ok {
		idx.layouts[label] = &layoutState{plan: plan, source: st.source}
	}
}

// CheckPublished is the index's test of the layout a ready node publishes:
// its layout annotation (has: whether the node has one) and fingerprint
// label. It
// returns the plan the node lends, or the rejection's reason (RejectDecode,
// RejectInvalid, RejectFingerprint) and what is wrong, so that a command that
// explains a node says exactly why the webhook ignores it.
func CheckPublished(annotation string, has bool, fingerprint string, rules layout.Rules) (layout.Plan, string, error) {
	if !has {
		return layout.Plan{}, RejectDecode, fmt.Errorf("node is labelled %s=%s but has no %s annotation", layout.LabelState, layout.StateReady, layout.AnnotationLayout)
	}
	plan, err := layout.Decode(annotation)
	if err != nil {
		return layout.Plan{}, RejectDecode, err
	}
	if errs := plan.Validate(rules); len(errs) > 0 {
		return layout.Plan{}, RejectInvalid, errs.ToAggregate()
	}
	if fp := plan.Fingerprint(); fp != fingerprint {
		return layout.Plan{}, RejectFingerprint, fmt.Errorf("label %s is %q but the layout's fingerprint is %q", layout.LabelFingerprint, fingerprint, fp)
	}
	return plan, "", nil
}

// putNode inserts or replaces a node in its layout. A node list that may be
// published is copied, so that published snapshots stay unchanged.
func (idx *Index) putNode(fp string, info *inject.NodeInfo, b *batch) {
	b.changed[fp] = true
	ls := idx.layouts[fp]
	i, found := slices.BinarySearchFunc(ls.nodes, info.Name, byName)
	if b.owned[fp] {
		if found {
			ls.gpus -= ls.nodes[i].AllocatableGPUs
			ls.nodes[i] = info
		} else {
			ls.nodes = slices.Insert(ls.nodes, i, info)
		}
		ls.gpus += info.AllocatableGPUs
		return
	}
	b.owned[fp] = true
	nodes := make([]*inject.NodeInfo, 0, len(ls.nodes)+1)
	nodes = append(nodes, ls.nodes[:i]...)
	nodes = append(nodes, info)
	if found {
		ls.gpus -= ls.nodes[i].AllocatableGPUs
		i++
	}
	nodes = append(nodes, ls.nodes[i:]...)
	ls.nodes = nodes
	ls.gpus += info.AllocatableGPUs
}

func (idx *Index) removeNode(fp, name string, b *batch) {
	b.changed[fp] = true
	ls := idx.layouts[fp]
	i, found := slices.BinarySearchFunc(ls.nodes, name, byName)
	if !found {
		return
	}
	ls.gpus -= ls.nodes[i].AllocatableGPUs
	if b.owned[fp] {
		ls.nodes = slices.Delete(ls.nodes, i, i+1)
		return
	}
	b.owned[fp] = true
	nodes := make([]*inject.NodeInfo, 0, len(ls.nodes)-1)
	nodes = append(nodes, ls.nodes[:i]...)
	ls.nodes = append(nodes, ls.nodes[i+1:]...)
}

func byName(n *inject.NodeInfo, name string) int { return strings.Compare(n.Name, name) }

// publish rebuilds the Layouts of the changed fingerprints and the snapshot.
func (idx *Index) publish(changed []string) {
	for _, fp := range changed {
		ls := idx.layouts[fp]
		if len(ls.nodes) == 0 {
			delete(idx.layouts, fp)
			layoutNodes.DeleteLabelValues(fp)
			continue
		}
		ls.latest = &inject.Layout{Fingerprint: fp, Plan: ls.plan, AllocatableGPUs: ls.gpus, Nodes: ls.nodes}
		layoutNodes.WithLabelValues(fp).Set(float64(len(ls.nodes)))
	}
	snap := make([]*inject.Layout, 0, len(idx.layouts))
	for _, ls := range idx.layouts {
		snap = append(snap, ls.latest)
	}
	slices.SortFunc(snap, func(a, b *inject.Layout) int { return strings.Compare(a.Fingerprint, b.Fingerprint) })
	known := len(snap)
	var expires int64
	if idx.cfg.Pinning.ByPool() {
		var next time.Time
		snap, next = idx.withPools(snap, idx.clock.Now())
		if !next.IsZero() {
			expires = next.UnixNano()
		}
	}
	idx.expires.Store(expires)
	idx.snapshot.Store(&snap)
	layoutsKnown.Set(float64(known))
}

// nodeFacts is what the index reads of a Node, taken from it once: from a
// watch event's Node under the index's lock, or by Transform while a list
// streams, so that a streamed list is held as these rather than as Nodes.
// Nothing in it refers to the Node: its strings are the interned labels'
// and annotation's, or the node's name.
type nodeFacts struct {
	// selected is set when ProbedNodes selects the node; the index keeps
	// nothing of one it does not, and its other facts are not read.
	selected bool
	// info is the NodeInfo to publish if the node changed, its GPUs with dra
	// DRA GPUs (0 when Transform read it: record adds the index's).
	info *inject.NodeInfo
	dra  int64
	// own are the GPUs of the node's allocatable alone, capped.
	own int64
	// pool is the node's pool key, interned; info.Pool is its value.
	pool   unique.Handle[string]
	source layoutSource
	// hasLayout is set when the node has the layout annotation at all.
	hasLayout bool
	// state is the probe's state label.
	state string
	// reason is the node's state-reason made fit for a denial, read only
	// for a wedged node.
	reason               string
	ready, unschedulable bool
}

// eligible: only a node that could run a pod now may lend its layout.
func (f *nodeFacts) eligible() bool {
	return f.state == layout.StateReady && !f.unschedulable && f.ready
}

// wedged: a node that would be a candidate, but for its wedged driver.
func (f *nodeFacts) wedged() bool {
	return f.state == layout.StateWedged && !f.unschedulable && f.ready
}

// factsOf reads n; old is what the index keeps of it, if anything, whose
// interned values are reused when n has the same; dra are the node's DRA
// GPUs.
func (idx *Index) factsOf(n *corev1.Node, old *nodeState, dra int64) nodeFacts {
	info := &inject.NodeInfo{Name: n.Name}
	f := nodeFacts{info: info}
	if !probedNodes.Matches(labels.Set(n.Labels)) {
		return f
	}
	f.selected, f.dra, f.ready, f.unschedulable = true, dra, NodeReady(n), n.Spec.Unschedulable
	if old != nil && old.info.Labels.SameAs(n.Labels) {
		info.Labels = old.info.Labels
	} else {
		info.Labels = inject.NewLabels(n.Labels)
	}
	// The values read by key are taken from the interned labels, so that
	// they keep no string of the Node.
	f.state = info.Labels.Get(layout.LabelState)
	f.source.label = info.Labels.Get(layout.LabelFingerprint)
	if key := pools.Key(n.Labels, idx.cfg.Pinning.NodeLabels); key != "" {
		if old != nil && old.pool != (unique.Handle[string]{}) && old.pool.Value() == key {
			f.pool = old.pool
		} else {
			f.pool = unique.Make(key)
		}
		info.Pool = f.pool.Value()
	}
	ann, has := n.Annotations[layout.AnnotationLayout]
	f.hasLayout = has
	if old != nil && old.source.annotation.Value() == ann {
		// Most events are status updates: compare rather than hash again.
		f.source.annotation = old.source.annotation
	} else {
		f.source.annotation = unique.Make(ann)
	}
	if f.wedged() {
		f.reason = cleanReason(n.Annotations[layout.AnnotationStateReason])
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			info.Taints = append(info.Taints, t)
		}
	}
	// A node offers a handful of GPU resource names at most; more than the
	// array holds only costs an allocation.
	var arr [8]inject.GPUResource
	entries := arr[:0]
	if dra > 0 {
		entries = append(entries, inject.GPUResource{Name: inject.DRAResource, Count: dra})
	}
	for name, q := range n.Status.Allocatable {
		if idx.cfg.IsGPUResource(string(name)) {
			if v := q.Value(); v > 0 {
				v = min(v, MaxNodeGPUs)
				f.own += v
				if inject.ValidResourceName(string(name)) {
					entries = append(entries, inject.GPUResource{Name: string(name), Count: v})
				}
			}
		}
	}
	slices.SortFunc(entries, func(a, b inject.GPUResource) int { return strings.Compare(a.Name, b.Name) })
	var oldGPUs inject.GPUResources
	if old != nil {
		oldGPUs = old.info.GPUs
	}
	info.GPUs = inject.MakeGPUResources(entries, oldGPUs)
	// The count comes from the node itself and weighs in the layout choice:
	// bound it, so one node cannot outweigh a pool or overflow the sum.
	f.own = min(f.own, MaxNodeGPUs)
	info.AllocatableGPUs = min(f.own+dra, MaxNodeGPUs)
	return f
}

// MaxNodeGPUs caps what one node counts for in a layout's GPU total: above
// any real node (8 GPUs x 7 MIG slices, or time-sliced replicas), far below
// what could let one node pull every pod onto its layout.
const MaxNodeGPUs = 256

func infoEqual(a, b *inject.NodeInfo) bool {
	if a.AllocatableGPUs != b.AllocatableGPUs || a.GPUs != b.GPUs || !a.Labels.Equal(b.Labels) || len(a.Taints) != len(b.Taints) {
		return false
	}
	for i := range a.Taints {
		if a.Taints[i].Key != b.Taints[i].Key || a.Taints[i].Value != b.Taints[i].Value || a.Taints[i].Effect != b.Taints[i].Effect {
			return false
		}
	}
	return true
}

// Transform reads a Node of a streamed list as it arrives (the reflector
// calls it, NodeStore.Transformer, before its temporary store) and hands
// the reflector a streamedNode instead: what the index will keep of the
// node, its labels and layout annotation interned, with its name, UID and
// resourceVersion. The reflector holds every item until the list ends, then
// hands them all to NodeStore.Replace at once; held as Nodes, even stripped,
// each would keep its own copy of the layout annotation until then. So what
// the index keeps is built while the list streams, and Replace only files
// it: each Node is garbage once read, while that garbage is short-lived,
// not among thousands of Nodes that all die when the list ends
// (docs/helm.md, "Memory"). Transform reads nothing of the index but its
// configuration, so it takes no lock; the DRA GPUs, which it cannot read,
// are added when the node is recorded. It changes nothing of obj. Other
// objects pass through unchanged.
func (idx *Index) Transform(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok || n == nil {
		return obj, nil
	}
	return &streamedNode{nodeFacts: idx.factsOf(n, nil, 0), uid: n.UID, resourceVersion: n.ResourceVersion}, nil
}

// streamedNode is what Transform makes of a Node: its facts, and the name,
// UID and resourceVersion that identify the Node. A reflector's temporary
// store keys items before it transforms them, so it reads none of this;
// client-go's data consistency check (KUBE_WATCHLIST_INCONSISTENCY_DETECTOR)
// compares the items' metadata by UID, which is why it is a runtime.Object
// with metadata.
type streamedNode struct {
	nodeFacts
	uid             types.UID
	resourceVersion string
}

var (
	_ runtime.Object            = &streamedNode{}
	_ metav1.ObjectMetaAccessor = &streamedNode{}
)

// GetObjectKind has no kind to tell: the object is never encoded.
func (*streamedNode) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies s; what its facts point to is never changed.
func (s *streamedNode) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}

// GetObjectMeta is the metadata that identifies the Node.
func (s *streamedNode) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: s.info.Name, UID: s.uid, ResourceVersion: s.resourceVersion}
}

// nodeName is the name of a Node as a reflector hands it to the store:
// streamed through Transform or not.
func nodeName(obj any) (string, bool) {
	switch n := obj.(type) {
	case *streamedNode:
		if n != nil && n.info != nil {
			return n.info.Name, true
		}
	case *corev1.Node:
		if n != nil {
			return n.Name, true
		}
	}
	return "", false
}

// Watch lists and watches the Nodes that ProbedNodes selects into the
// index until ctx ends. The index is the reflector's store: no informer
// cache holds the Nodes besides, only what the index keeps of each, which
// at thousands of GPU nodes is most of the webhook's memory.
func (idx *Index) Watch(ctx context.Context, lw toolscache.ListerWatcher) {
	r := toolscache.NewReflectorWithOptions(lw, &corev1.Node{}, NodeStore{idx}, toolscache.ReflectorOptions{Name: "nodes", Logger: &idx.log})
	r.RunWithContext(ctx)
}

// probedNodes is ProbedNodes, made once.
var probedNodes = func() labels.Selector {
	probed, err := labels.NewRequirement(layout.LabelState, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	gpu, err := labels.NewRequirement(layout.LabelState, selection.NotEquals, []string{layout.StateNoDriver})
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*probed, *gpu)
}()

// ProbedNodes selects the Nodes the index keeps: those the probe labelled
// with a state other than no-driver. Only they can lend a layout, be a
// member of a pool or be named as wedged in a denial; a node the probe has
// not examined yet, or where it found no NVIDIA device at all (the chart
// runs it on every node, and on a CPU node it publishes no-driver), is
// never one, so the API server does not send it. A Node whose labels stop
// matching reaches a watch as a deletion, and the index forgets it; the
// index also forgets a Node it is handed that does not match (the offline
// command's --nodes file).
func ProbedNodes() labels.Selector { return probedNodes }

// NodeListWatch lists and watches the Nodes that ProbedNodes selects, as
// protobuf. A label selector needs no other permission than list and watch
// of Nodes.
func NodeListWatch(cfg *rest.Config) (toolscache.ListerWatcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create the node client: %w", err)
	}
	return toolscache.NewFilteredListWatchFromClient(c.RESTClient(), "nodes", metav1.NamespaceAll, selectProbed), nil
}

// selectProbed asks a list or watch of Nodes for those ProbedNodes selects.
func selectProbed(o *metav1.ListOptions) { o.LabelSelector = probedNodes.String() }

// NodeStore is the index as a reflector's store of Nodes.
type NodeStore struct{ idx *Index }

var _ toolscache.TransformingStore = NodeStore{}

// NewNodeStore is idx as a reflector's store of Nodes.
func NewNodeStore(idx *Index) NodeStore { return NodeStore{idx} }

// Add records a Node.
func (s NodeStore) Add(obj any) error { return s.Update(obj) }

// Update records a Node.
func (s NodeStore) Update(obj any) error {
	switch n := obj.(type) {
	case *streamedNode:
		if n != nil && n.info != nil {
			s.idx.updateFacts(&n.nodeFacts)
			return nil
		}
	case *corev1.Node:
		if n != nil {
			s.idx.Update(n)
			return nil
		}
	}
	return fmt.Errorf("failed to record a node: got %T", obj)
}

// Delete forgets a Node.
func (s NodeStore) Delete(obj any) error {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	name, ok := nodeName(obj)
	if !ok {
		return fmt.Errorf("failed to forget a node: got %T", obj)
	}
	s.idx.Delete(name)
	return nil
}

// Replace records a full list: every Node in it, and forgets those not in
// it (deleted while the watch was down).
func (s NodeStore) Replace(list []any, _ string) error {
	if err := s.idx.replace(list); err != nil {
		return err
	}
	if !s.idx.listed.Swap(true) {
		// The first list makes the most garbage the process ever makes:
		// every GPU node decoded whole, to keep a small part of it. Left to
		// itself the runtime would keep the heap that garbage grew resident
		// and return it over minutes; a webhook lives on what the index
		// keeps.
		debug.FreeOSMemory()
	}
	return nil
}

// Resync has nothing to do: the index is not a queue.
func (NodeStore) Resync() error { return nil }

// Transformer reads the Nodes of a streamed list as they arrive, so that the
// reflector holds what the index keeps of them rather than the Nodes.
func (s NodeStore) Transformer() toolscache.TransformFunc { return s.idx.Transform }

// nodeNames are the names of the Nodes the index knows.
func (idx *Index) nodeNames() []string {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	return slices.Collect(maps.Keys(idx.nodes))
}
