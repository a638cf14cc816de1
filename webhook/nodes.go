package webhook

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// Index holds the driver layouts that ready GPU nodes publish, grouped by
// fingerprint. Writers (informer events) serialise on a mutex and publish an
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

	snapshot atomic.Pointer[[]*Layout]
	synced   atomic.Pointer[func() bool]

	// strs interns the strings that repeat across cached Nodes: label keys
	// and common values, and the layout annotation, which every node of a
	// pool publishes byte for byte (a few KiB each, 5,000 times over).
	strsMu sync.Mutex
	strs   map[string]string
	// expires is when a remembered layout in the snapshot expires (Unix
	// nanoseconds, 0 for none): the next reader after it publishes anew.
	expires atomic.Int64
}

// nodeState is what the index remembers of one Node between events.
type nodeState struct {
	info *NodeInfo
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
	// pool is the node's pool key; member its value in the pool view, when
	// isMember (it is ready and probed).
	pool     string
	member   string
	isMember bool
}

// layoutSource is what a node publishes about its layout. Its strings are
// those of the cached Node, shared rather than copied.
type layoutSource struct {
	annotation string
	label      string
}

// layoutState is one fingerprint's plan and its nodes, sorted by name.
type layoutState struct {
	plan   layout.Plan
	source layoutSource
	nodes  []*NodeInfo
	gpus   int64
	latest *Layout
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
	}
	empty := []*Layout{}
	idx.snapshot.Store(&empty)
	return idx
}

// Layouts returns the current candidate layouts, sorted by fingerprint. The
// slice and everything it points to are shared and must not be changed.
func (idx *Index) Layouts() []*Layout {
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
func (idx *Index) Ready() bool {
	f := idx.synced.Load()
	return f != nil && (*f)()
}

// ReadyCheck is a healthz checker for /readyz.
func (idx *Index) ReadyCheck(_ *http.Request) error {
	if !idx.Ready() {
		return fmt.Errorf("node index has not synced yet")
	}
	return nil
}

// Watch feeds the index from the cache's Node informer. The cache must strip
// Nodes with idx.Transform (see CacheOptions).
func (idx *Index) Watch(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("failed to get the node informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { idx.onEvent(obj, false) },
		UpdateFunc: func(_, obj any) { idx.onEvent(obj, false) },
		DeleteFunc: func(obj any) { idx.onEvent(obj, true) },
	})
	if err != nil {
		return fmt.Errorf("failed to add the node event handler: %w", err)
	}
	synced := reg.HasSynced
	idx.synced.Store(&synced)
	return nil
}

func (idx *Index) onEvent(obj any, deleted bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj, deleted = t.Obj, true
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	if deleted {
		idx.Delete(n.Name)
		return
	}
	// A cached Node is never changed, so the index may keep its labels.
	idx.update(n, false)
}

// Add records a Node; it is Update under the name informers use.
func (idx *Index) Add(n *corev1.Node) { idx.Update(n) }

// Update records the current state of a Node. It keeps nothing of n that
// the caller may change later.
func (idx *Index) Update(n *corev1.Node) { idx.update(n, true) }

func (idx *Index) update(n *corev1.Node, cloneLabels bool) {
	info := idx.nodeInfo(n)
	eligible := nodeEligible(n)
	source := layoutSource{annotation: n.Annotations[layout.AnnotationLayout], label: n.Labels[layout.LabelFingerprint]}

	idx.mu.Lock()
	defer idx.mu.Unlock()
	own := info.AllocatableGPUs
	info.AllocatableGPUs = min(own+idx.draGPUs[n.Name], MaxNodeGPUs)
	old := idx.nodes[n.Name]
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
	poolChanged := idx.setPoolMember(n.Name, old, st, n)

	oldFP := ""
	if old != nil {
		oldFP = old.fingerprint
		if oldFP == st.fingerprint && (oldFP == "" || infoEqual(old.info, info)) {
			// Keep the published NodeInfo, which owns its label map.
			if oldFP != "" {
				st.info = old.info
			}
			if poolChanged {
				idx.publish(nil)
			}
			return
		}
	}
	if cloneLabels {
		// Published NodeInfo must not share the caller's label map.
		info.Labels = maps.Clone(info.Labels)
	}
	changed := make([]string, 0, 2)
	if oldFP != "" && oldFP != st.fingerprint {
		idx.removeNode(oldFP, n.Name)
		changed = append(changed, oldFP)
	}
	if st.fingerprint != "" {
		idx.putNode(st.fingerprint, info)
		changed = append(changed, st.fingerprint)
	}
	idx.publish(changed)
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
	st.info = &info
	if st.fingerprint != "" {
		idx.putNode(st.fingerprint, &info)
		idx.publish([]string{st.fingerprint})
	}
}

// Delete forgets a Node.
func (idx *Index) Delete(name string) {
	idx.mu.Lock()
	defer idx.mu.Unlock()
	old, ok := idx.nodes[name]
	if !ok {
		return
	}
	delete(idx.nodes, name)
	poolChanged := idx.setPoolMember(name, old, nil, nil)
	if old.fingerprint != "" {
		idx.removeNode(old.fingerprint, name)
		idx.publish([]string{old.fingerprint})
	} else if poolChanged {
		idx.publish(nil)
	}
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

// putNode inserts or replaces a node in its layout, copying the slice so that
// published snapshots stay unchanged.
func (idx *Index) putNode(fp string, info *NodeInfo) {
	ls := idx.layouts[fp]
	i, found := slices.BinarySearchFunc(ls.nodes, info.Name, byName)
	nodes := make([]*NodeInfo, 0, len(ls.nodes)+1)
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

func (idx *Index) removeNode(fp, name string) {
	ls := idx.layouts[fp]
	i, found := slices.BinarySearchFunc(ls.nodes, name, byName)
	if !found {
		return
	}
	ls.gpus -= ls.nodes[i].AllocatableGPUs
	nodes := make([]*NodeInfo, 0, len(ls.nodes)-1)
	nodes = append(nodes, ls.nodes[:i]...)
	ls.nodes = append(nodes, ls.nodes[i+1:]...)
}

func byName(n *NodeInfo, name string) int { return strings.Compare(n.Name, name) }

// publish rebuilds the Layouts of the changed fingerprints and the snapshot.
func (idx *Index) publish(changed []string) {
	for _, fp := range changed {
		ls := idx.layouts[fp]
		if len(ls.nodes) == 0 {
			delete(idx.layouts, fp)
			layoutNodes.DeleteLabelValues(fp)
			continue
		}
		ls.latest = &Layout{Fingerprint: fp, Plan: ls.plan, AllocatableGPUs: ls.gpus, Nodes: ls.nodes}
		layoutNodes.WithLabelValues(fp).Set(float64(len(ls.nodes)))
	}
	snap := make([]*Layout, 0, len(idx.layouts))
	for _, ls := range idx.layouts {
		snap = append(snap, ls.latest)
	}
	slices.SortFunc(snap, func(a, b *Layout) int { return strings.Compare(a.Fingerprint, b.Fingerprint) })
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
	if n.Labels[layout.LabelState] != layout.StateReady || n.Spec.Unschedulable {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (idx *Index) nodeInfo(n *corev1.Node) *NodeInfo {
	info := &NodeInfo{Name: n.Name, Labels: n.Labels, pool: PoolKey(n.Labels, idx.cfg.Pinning.NodeLabels)}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			info.Taints = append(info.Taints, t)
		}
	}
	for name, q := range n.Status.Allocatable {
		if IsGPUResource(idx.cfg, name) {
			if v := q.Value(); v > 0 {
				info.AllocatableGPUs += min(v, MaxNodeGPUs)
			}
		}
	}
	// The count comes from the node itself and weighs in the layout choice:
	// bound it, so one node cannot outweigh a pool or overflow the sum.
	info.AllocatableGPUs = min(info.AllocatableGPUs, MaxNodeGPUs)
	return info
}

// MaxNodeGPUs caps what one node counts for in a layout's GPU total: above
// any real node (8 GPUs x 7 MIG slices, or time-sliced replicas), far below
// what could let one node pull every pod onto its layout.
const MaxNodeGPUs = 256

func infoEqual(a, b *NodeInfo) bool {
	if a.AllocatableGPUs != b.AllocatableGPUs || len(a.Labels) != len(b.Labels) || len(a.Taints) != len(b.Taints) {
		return false
	}
	for k, v := range a.Labels {
		if w, ok := b.Labels[k]; !ok || w != v {
			return false
		}
	}
	for i := range a.Taints {
		if a.Taints[i].Key != b.Taints[i].Key || a.Taints[i].Value != b.Taints[i].Value || a.Taints[i].Effect != b.Taints[i].Effect {
			return false
		}
	}
	return true
}

// Transform strips a Node down to what the index reads before the informer
// stores it: on a large cluster, images and managedFields alone are most of
// each object's size.
func (idx *Index) Transform(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.OwnerReferences = nil
	n.Finalizers = nil
	idx.strsMu.Lock()
	defer idx.strsMu.Unlock()
	if len(idx.strs) > maxInterned {
		// Values of nodes long gone: start over rather than grow forever.
		idx.strs = nil
	}
	var ann map[string]string
	for k, v := range n.Annotations {
		if strings.HasPrefix(k, layout.Prefix) {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[idx.intern(k)] = idx.intern(v)
		}
	}
	n.Annotations = ann
	labels := make(map[string]string, len(n.Labels))
	for k, v := range n.Labels {
		if k != corev1.LabelHostname {
			v = idx.intern(v)
		}
		labels[idx.intern(k)] = v
	}
	n.Labels = labels
	n.Spec = corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints}
	status := corev1.NodeStatus{}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			status.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	for name, q := range n.Status.Allocatable {
		if IsGPUResource(idx.cfg, name) {
			if status.Allocatable == nil {
				status.Allocatable = corev1.ResourceList{}
			}
			status.Allocatable[name] = q
		}
	}
	n.Status = status
	return n, nil
}

// maxInterned bounds the interned strings: far above the distinct label
// keys and values of a large cluster.
const maxInterned = 50000

// intern returns the one copy of s the index keeps; strsMu is held.
func (idx *Index) intern(s string) string {
	if v, ok := idx.strs[s]; ok {
		return v
	}
	if idx.strs == nil {
		idx.strs = map[string]string{}
	}
	idx.strs[s] = s
	return s
}

// CacheByObject is the manager cache entry for Nodes.
func (idx *Index) CacheByObject() cache.ByObject {
	return cache.ByObject{Transform: idx.Transform}
}
