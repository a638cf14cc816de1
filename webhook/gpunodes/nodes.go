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
	"unicode"
	"unicode/utf8"
	"unique"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
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
	pools     map[string]*poolState
	memory    map[string]PoolMemory
	poolViews map[string]poolView
	now       func() time.Time
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

// nodeState is what the index remembers of one Node between events.
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
	// rejection is the reason the source was rejected, if it was.
	rejection string
	// wedged is set while the node is ready and schedulable but its probe
	// marks the driver wedged.
	wedged *inject.WedgedNode
	// pool is the node's pool key; member its value in the pool view, when
	// isMember (it is ready and probed).
	pool     string
	member   string
	isMember bool
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
		now:     time.Now,
		draGPUs: map[string]int64{},
		wedged:  map[string]*inject.WedgedNode{},
	}
	empty := []*inject.Layout{}
	idx.snapshot.Store(&empty)
	noWedged := []*inject.WedgedNode{}
	idx.wedgedSnap.Store(&noWedged)
	return idx
}

// SetClock replaces the clock that remembered pools are aged against, for
// tests that read a pool's memory at a fixed time.
func (idx *Index) SetClock(now func() time.Time) { idx.now = now }

// Wedged returns the ready, schedulable nodes whose driver is wedged, sorted
// by name. The slice is shared and must not be changed.
func (idx *Index) Wedged() []*inject.WedgedNode { return *idx.wedgedSnap.Load() }

// Layouts returns the current candidate layouts, sorted by fingerprint. The
// slice and everything it points to are shared and must not be changed.
func (idx *Index) Layouts() []*inject.Layout {
	if exp := idx.expires.Load(); exp != 0 && idx.now().UnixNano() >= exp {
		idx.mu.Lock()
		if exp := idx.expires.Load(); exp != 0 && idx.now().UnixNano() >= exp {
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
func (idx *Index) Update(n *corev1.Node) { idx.update(n, nil) }

// update is Update with the node's labels already interned, if labels is
// not nil (a streamed Node's, whose label map Transform cut down).
func (idx *Index) update(n *corev1.Node, labels *inject.Labels) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	idx.record(n, labels, b)
	idx.flush(b)
}

// Replace records a full list of Nodes: every Node in it, and forgets those
// not in it. It publishes once for the whole list, where Update publishes
// once per Node and copies its layout's node list each time.
func (idx *Index) Replace(nodes []*corev1.Node) {
	list := make([]streamedNode, len(nodes))
	for i, n := range nodes {
		list[i].Node = n
	}
	idx.replace(list)
}

// replace is Replace of Nodes as a reflector hands them over: streamed ones
// with their labels interned, listed ones as they are.
func (idx *Index) replace(nodes []streamedNode) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	b := newBatch()
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		seen[n.Name] = true
		idx.record(n.Node, n.labels, b)
	}
	for name := range idx.nodes {
		if !seen[name] {
			idx.forget(name, b)
		}
	}
	idx.flush(b)
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

// record is Update under idx.mu, publishing through b.
func (idx *Index) record(n *corev1.Node, labels *inject.Labels, b *batch) {
	old := idx.nodes[n.Name]
	info := idx.nodeInfo(n, labels, old)
	eligible := nodeEligible(n)
	source := layoutSource{label: n.Labels[layout.LabelFingerprint]}
	if ann := n.Annotations[layout.AnnotationLayout]; old != nil && old.source.annotation.Value() == ann {
		// Most events are status updates: compare rather than hash again.
		source.annotation = old.source.annotation
	} else {
		source.annotation = unique.Make(ann)
	}
	own := info.AllocatableGPUs
	info.AllocatableGPUs = min(own+idx.draGPUs[n.Name], MaxNodeGPUs)
	st := &nodeState{info: info, ownGPUs: own, source: source}
	if eligible {
		switch {
		case old != nil && old.source == source && old.rejection != "":
			// Same rejected value as before: already logged and counted.
			st.rejection = old.rejection
		case old != nil && old.source == source && old.fingerprint != "":
			st.fingerprint = old.fingerprint
		default:
			idx.admit(n, st)
		}
	}
	idx.nodes[n.Name] = st
	idx.recordWedged(n, info, old, st, b)
	poolChanged := idx.setPoolMember(n.Name, old, st, n)

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
		idx.removeNode(oldFP, n.Name, b)
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

// recordWedged keeps st.wedged and idx.wedged in step with n: a node that
// is ready and schedulable but wedged. An event that changes nothing of it (a
// heartbeat) keeps the published WedgedNode.
func (idx *Index) recordWedged(n *corev1.Node, info *inject.NodeInfo, old, st *nodeState, b *batch) {
	if !nodeWedged(n) {
		if old != nil && old.wedged != nil {
			delete(idx.wedged, n.Name)
			b.wedged = true
		}
		return
	}
	reason := cleanReason(n.Annotations[layout.AnnotationStateReason])
	if old != nil && old.wedged != nil && old.wedged.Reason == reason && infoEqual(old.wedged.Node, info) {
		st.wedged = old.wedged
		return
	}
	st.wedged = &inject.WedgedNode{Node: info, Reason: reason}
	idx.wedged[n.Name] = st.wedged
	b.wedged = true
}

// nodeWedged: a node that would be a candidate, but for its wedged driver.
func nodeWedged(n *corev1.Node) bool {
	return n.Labels[layout.LabelState] == layout.StateWedged && !n.Spec.Unschedulable && nodeReady(n)
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
	var b strings.Builder
	for _, r := range s {
		if !unicode.IsPrint(r) {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > maxReasonBytes {
			b.WriteString("...")
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// admit checks a ready node's published layout, setting st.fingerprint or
// st.rejection. A layout already known under the same source is not decoded
// again: one decode per fingerprint, not per node.
func (idx *Index) admit(n *corev1.Node, st *nodeState) {
	raw, hasRaw := n.Annotations[layout.AnnotationLayout]
	label := n.Labels[layout.LabelFingerprint]
	if ls, ok := idx.layouts[label]; ok && ls.source == st.source {
		st.fingerprint = label
		return
	}
	reject := func(reason string, err error) {
		st.rejection = reason
		layoutsRejected.WithLabelValues(reason).Inc()
		idx.log.Info("ignoring the layout published by node", "node", n.Name, "reason", reason, "error", err.Error())
	}
	if !hasRaw {
		reject(RejectDecode, fmt.Errorf("node is labelled %s=%s but has no %s annotation", layout.LabelState, layout.StateReady, layout.AnnotationLayout))
		return
	}
	plan, err := layout.Decode(raw)
	if err != nil {
		reject(RejectDecode, err)
		return
	}
	if errs := plan.Validate(idx.rules); len(errs) > 0 {
		reject(RejectInvalid, errs.ToAggregate())
		return
	}
	if fp := plan.Fingerprint(); fp != label {
		reject(RejectFingerprint, fmt.Errorf("label %s is %q but the layout's fingerprint is %q", layout.LabelFingerprint, label, fp))
		return
	}
	st.fingerprint = label
	if _, ok := idx.layouts[label]; !ok {
		idx.layouts[label] = &layoutState{plan: plan, source: st.source}
	}
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
		snap, next = idx.withPools(snap, idx.now())
		if !next.IsZero() {
			expires = next.UnixNano()
		}
	}
	idx.expires.Store(expires)
	idx.snapshot.Store(&snap)
	layoutsKnown.Set(float64(known))
}

// nodeEligible: only a node that could run a pod now may lend its layout.
func nodeEligible(n *corev1.Node) bool {
	return n.Labels[layout.LabelState] == layout.StateReady && !n.Spec.Unschedulable && nodeReady(n)
}

// nodeInfo is what the index keeps of n; labels are n's labels interned,
// if not nil; old is what it kept before, if any.
func (idx *Index) nodeInfo(n *corev1.Node, labels *inject.Labels, old *nodeState) *inject.NodeInfo {
	info := &inject.NodeInfo{Name: n.Name, Pool: PoolKey(n.Labels, idx.cfg.Pinning.NodeLabels)}
	switch {
	case labels != nil:
		info.Labels = *labels
	case old != nil && old.info != nil && old.info.Labels.SameAs(n.Labels):
		info.Labels = old.info.Labels
	default:
		info.Labels = inject.NewLabels(n.Labels)
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
	if dra := idx.draGPUs[n.Name]; dra > 0 {
		entries = append(entries, inject.GPUResource{Name: inject.DRAResource, Count: dra})
	}
	for name, q := range n.Status.Allocatable {
		if idx.cfg.IsGPUResource(string(name)) {
			if v := q.Value(); v > 0 {
				v = min(v, MaxNodeGPUs)
				info.AllocatableGPUs += v
				if inject.ValidResourceName(string(name)) {
					entries = append(entries, inject.GPUResource{Name: string(name), Count: v})
				}
			}
		}
	}
	slices.SortFunc(entries, func(a, b inject.GPUResource) int { return strings.Compare(a.Name, b.Name) })
	var oldGPUs inject.GPUResources
	if old != nil && old.info != nil {
		oldGPUs = old.info.GPUs
	}
	info.GPUs = inject.MakeGPUResources(entries, oldGPUs)
	// The count comes from the node itself and weighs in the layout choice:
	// bound it, so one node cannot outweigh a pool or overflow the sum.
	info.AllocatableGPUs = min(info.AllocatableGPUs, MaxNodeGPUs)
	return info
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

// Transform strips a Node down to what the index reads. The index keeps no
// Node, but a reflector streaming the first list holds all of them until the
// list ends (NodeStore.Transformer); on a large cluster images and
// managedFields alone are most of each object's size, and a GPU operator
// node's hundred labels most of the rest (about 9 KiB a map). So the labels
// are interned here, while the list streams, and the Node keeps only the
// few the index reads by key: the reflector holds a streamedNode of a few
// hundred bytes per node instead of a map, and what the index keeps is made
// while each Node's garbage is still short-lived, not among thousands of
// Nodes that all die at once when the list ends (which left the heap's
// spans half empty). Other objects pass through unchanged.
func (idx *Index) Transform(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	labels := inject.NewLabels(n.Labels)
	n.Labels = idx.labelsReadByKey(n.Labels)
	n.ManagedFields = nil
	n.OwnerReferences = nil
	n.Finalizers = nil
	var ann map[string]string
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, layout.Prefix) {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	n.Annotations = ann
	n.Spec = corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints}
	status := corev1.NodeStatus{}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	for name, q := range n.Status.Allocatable {
		if idx.cfg.IsGPUResource(string(name)) {
			if status.Allocatable == nil {
				status.Allocatable = corev1.ResourceList{}
			}
			status.Allocatable[name] = q
		}
	}
	n.Status = status
	return &streamedNode{Node: n, labels: &labels}, nil
}

// labelsReadByKey are the labels of m that the index reads by key rather
// than through a NodeInfo's Labels: the probe's state and fingerprint, and
// the pool's keys.
func (idx *Index) labelsReadByKey(m map[string]string) map[string]string {
	var out map[string]string
	keep := func(k string) {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, 2+len(idx.cfg.Pinning.NodeLabels))
			}
			out[k] = v
		}
	}
	keep(layout.LabelState)
	keep(layout.LabelFingerprint)
	for _, k := range idx.cfg.Pinning.NodeLabels {
		keep(k)
	}
	return out
}

// streamedNode is what Transform makes of a Node: the stripped Node, whose
// label map holds only the labels read by key, and all its labels interned
// (nil for a Node that did not go through Transform). It is a
// runtime.Object and a metav1.Object through the Node, so a reflector's
// temporary store keys it as it would the Node.
type streamedNode struct {
	*corev1.Node
	labels *inject.Labels
}

// asNode is a Node as a reflector hands it to the store: streamed through
// Transform or not.
func asNode(obj any) (streamedNode, bool) {
	switch n := obj.(type) {
	case *streamedNode:
		if n == nil || n.Node == nil {
			return streamedNode{}, false
		}
		return *n, true
	case *corev1.Node:
		return streamedNode{Node: n}, n != nil
	}
	return streamedNode{}, false
}

// Watch lists and watches Nodes into the index until ctx ends. The index is
// the reflector's store: no informer cache holds the Nodes besides, only
// what the index keeps of each, which at thousands of nodes is most of the
// webhook's memory.
func (idx *Index) Watch(ctx context.Context, lw toolscache.ListerWatcher) {
	r := toolscache.NewReflectorWithOptions(lw, &corev1.Node{}, NodeStore{idx}, toolscache.ReflectorOptions{Name: "nodes", Logger: &idx.log})
	r.RunWithContext(ctx)
}

// NodeListWatch lists and watches every Node, as protobuf.
func NodeListWatch(cfg *rest.Config) (toolscache.ListerWatcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to create the node client: %w", err)
	}
	return toolscache.NewListWatchFromClient(c.RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()), nil
}

// NodeStore is the index as a reflector's store of Nodes.
type NodeStore struct{ idx *Index }

var _ toolscache.TransformingStore = NodeStore{}

// NewNodeStore is idx as a reflector's store of Nodes.
func NewNodeStore(idx *Index) NodeStore { return NodeStore{idx} }

// Add records a Node.
func (s NodeStore) Add(obj any) error { return s.Update(obj) }

// Update records a Node.
func (s NodeStore) Update(obj any) error {
	n, ok := asNode(obj)
	if !ok {
		return fmt.Errorf("failed to record a node: got %T", obj)
	}
	s.idx.update(n.Node, n.labels)
	return nil
}

// Delete forgets a Node.
func (s NodeStore) Delete(obj any) error {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := asNode(obj)
	if !ok {
		return fmt.Errorf("failed to forget a node: got %T", obj)
	}
	s.idx.Delete(n.Name)
	return nil
}

// Replace records a full list: every Node in it, and forgets those not in
// it (deleted while the watch was down).
func (s NodeStore) Replace(list []any, _ string) error {
	nodes := make([]streamedNode, 0, len(list))
	for _, obj := range list {
		n, ok := asNode(obj)
		if !ok {
			return fmt.Errorf("failed to record a node: got %T", obj)
		}
		nodes = append(nodes, n)
	}
	s.idx.replace(nodes)
	if !s.idx.listed.Swap(true) {
		// The first list is the largest the process ever holds at once:
		// every Node, decoded whole, and the index being built from them.
		// Left to itself the runtime would keep that peak resident until
		// the next collection and return it over minutes; a webhook lives
		// on what the index keeps, a tenth of it at thousands of nodes.
		debug.FreeOSMemory()
	}
	return nil
}

// Resync has nothing to do: the index is not a queue.
func (NodeStore) Resync() error { return nil }

// Transformer strips the Nodes a reflector holds while it streams a list.
func (s NodeStore) Transformer() toolscache.TransformFunc { return s.idx.Transform }

// nodeNames are the names of the Nodes the index knows.
func (idx *Index) nodeNames() []string {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	return slices.Collect(maps.Keys(idx.nodes))
}
