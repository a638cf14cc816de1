package inject

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

// podView is the pod as a layout choice reads it, and what fitting each of
// the request's layouts to it came to: a layout is fitted once per view,
// whether the NRI plugin's choice or the layout choice asks first.
type podView struct {
	pod  *corev1.Pod
	fits []fitted
}

type fitted struct {
	misfit misfit
	done   bool
}

// fit is layoutFit of the request's layout i, worked out once per view.
func (r *request) fit(v *podView, i int) misfit {
	if v.fits == nil {
		v.fits = make([]fitted, len(r.layouts))
	}
	f := &v.fits[i]
	if !f.done {
		f.misfit, f.done = r.layoutFit(v.pod, r.layouts[i]), true
	}
	return f.misfit
}

// misfitKind is why no node of a layout, or a node, can take the pod.
type misfitKind uint8

const (
	fits misfitKind = iota
	// misfitBound: the pod is bound to another node.
	misfitBound
	// misfitSelector: the pod's nodeSelector or required affinity.
	misfitSelector
	// misfitNodeLacks: the nodes the pod may land on lack a GPU resource it
	// requests.
	misfitNodeLacks
	// misfitLayoutLacks: no node of the layout offers it.
	misfitLayoutLacks
	misfitTaint
	misfitNoNodes
)

// misfit is a misfitKind and what its message names.
type misfit struct {
	kind misfitKind
	// taint is the taint the pod does not tolerate (misfitTaint).
	taint *corev1.Taint
	// missing are the resources not offered (misfitNodeLacks, misfitLayoutLacks).
	missing []string
}

// why is the misfit's message, for the pod as the view has it.
func (r *request) why(pod *corev1.Pod, m misfit) string {
	switch m.kind {
	case misfitBound:
		return fmt.Sprintf("pod is bound to node %q", pod.Spec.NodeName)
	case misfitSelector:
		return "no node matches the pod's nodeSelector or required node affinity"
	case misfitNodeLacks:
		return "no node the pod may land on offers " + describeResources(m.missing)
	case misfitLayoutLacks:
		return "no node offers " + describeResources(m.missing)
	case misfitTaint:
		return untoleratedTaint(pod, m.taint, r.renamed)
	case misfitNoNodes:
		return "no ready nodes"
	}
	return ""
}

// chooseLayout returns the layout for the pod, or nil and why none fits.
//
// Policy MostGPUs: among layouts with at least one ready node the pod may land
// on (nodeName, nodeSelector, required node affinity, the GPU resources it
// requests, NoSchedule/NoExecute taints), the one with the most allocatable
// GPUs of the resources the pod requests, then the newest driver, then the
// smallest fingerprint so that replicas agree. NewestDriver swaps the first
// two keys; Spread picks among those that fit, weighted by their GPUs. A pod
// injected before keeps its layout while that fits it (prev). With keep, only
// layouts that hold the pod's hand-written driver mounts are candidates.
func (r *request) chooseLayout(v *podView, prev *layout.Injected, keep bool) (*Layout, string) {
	if prev != nil && prev.StaticLayout != "" {
		if s, ok := r.cfg.Static(prev.StaticLayout); ok {
			return &Layout{Static: s.Name, Plan: s.Plan, NodeSelector: s.NodeSelector}, ""
		}
		return nil, "static layout " + prev.StaticLayout + " is gone"
	}
	order := r.ranking(keep)
	if len(order) == 0 {
		if r.cfg.Pinning.ByPool() {
			return nil, "no GPU node publishes a ready layout, and no pool at zero is remembered or declared (config.pinning.pools)"
		}
		return nil, "no GPU node publishes a ready layout (for GPU pools at zero: pin by pool with config.pinning.nodeLabels and declare their layouts in config.pinning.pools)"
	}
	spread := r.cfg.LayoutPolicy == config.LayoutPolicySpread && prev == nil
	misfits := make([]rankedMisfit, 0, maxMisfitsNamed)
	var fit []rankedLayout
	for _, rl := range order {
		if r.canceled() {
			return nil, "the API server stopped waiting"
		}
		l := rl.layout
		if prev != nil && (l.Fingerprint != prev.Fingerprint || (l.Pool != "" && !poolsHold(l.Pool, prev.Pool))) {
			continue
		}
		if spread && l.Remembered != nil && len(fit) > 0 {
			break
		}
		m := r.fit(v, rl.index)
		switch {
		case m.kind == fits && !spread:
			return l, ""
		case m.kind == fits:
			fit = append(fit, rl)
		case len(misfits) < maxMisfitsNamed:
			misfits = append(misfits, rankedMisfit{l, m})
		}
	}
	if len(fit) > 0 {
		return spreadPick(fit, r.seed), ""
	}
	if prev != nil {
		return nil, ""
	}
	reasons := make([]string, 0, len(misfits)+1)
	for _, m := range misfits {
		reasons = append(reasons, layoutDescription(m.layout)+": "+r.why(v.pod, m.misfit))
	}
	if len(order) > len(reasons) {
		reasons = append(reasons, fmt.Sprintf("and %d more layouts", len(order)-len(reasons)))
	}
	return nil, strings.Join(reasons, "; ")
}

// maxMisfitsNamed is how many layouts a denial names with why they do not fit.
const maxMisfitsNamed = 5

type rankedMisfit struct {
	layout *Layout
	misfit misfit
}

// spreadPick picks among the layouts that fit, weighted by GPUs, in the
// policy's order, so that the same seed always picks the same layout.
func spreadPick(fit []rankedLayout, seed uint64) *Layout {
	var weight uint64
	for _, rl := range fit {
		weight += uint64(max(rl.gpus, 1))
	}
	pick := seed % weight
	for _, rl := range fit {
		w := uint64(max(rl.gpus, 1))
		if pick < w {
			return rl.layout
		}
		pick -= w
	}
	return fit[len(fit)-1].layout
}

// rankedLayout is one of the request's layouts (index) and its GPUs of the
// resources the pod requests, which the policy weighs.
type rankedLayout struct {
	layout *Layout
	gpus   int64
	index  int
	// established: enough nodes publish the layout for the policy to weigh
	// it against others (request.established).
	established bool
}

// ranking is the request's layouts in the policy's order, sorted once per
// request; with keep, only those that hold the hand-written driver mounts.
func (r *request) ranking(keep bool) []rankedLayout {
	if r.ranked != nil {
		return r.ranked
	}
	order := make([]rankedLayout, 0, len(r.layouts))
	for i, l := range r.layouts {
		if !keep || holdsLegacy(l.Plan, r.legacy) {
			order = append(order, rankedLayout{layout: l, gpus: r.rankGPUs(l), index: i, established: r.established(l)})
		}
	}
	// SortStableFunc rather than sort.SliceStable: no reflection, on every
	// request.
	slices.SortStableFunc(order, func(a, b rankedLayout) int {
		switch {
		case better(a, b, r.cfg.LayoutPolicy):
			return -1
		case better(b, a, r.cfg.LayoutPolicy):
			return 1
		}
		return 0
	})
	r.ranked = order
	return order
}

func better(ra, rb rankedLayout, policy config.LayoutPolicy) bool {
	a, b := ra.layout, rb.layout
	// A pool at zero only when no node up now fits: the pod should not wait
	// for a scale-up while a node could run it.
	if (a.Remembered == nil) != (b.Remembered == nil) {
		return a.Remembered == nil
	}
	// A layout few nodes publish is what one compromised node can make up:
	// it is used only where no established layout fits.
	// Only among layouts that offer the pod what it asks for: one that
	// does not is no preference of the policy's.
	if (ra.gpus > 0) != (rb.gpus > 0) {
		return ra.gpus > 0
	}
	if ra.established != rb.established {
		return ra.established
	}
	dv := layout.CompareVersions(a.Plan.DriverVersion, b.Plan.DriverVersion)
	if policy == config.LayoutPolicyNewestDriver && ra.established && dv != 0 {
		return dv > 0
	}
	if ra.gpus != rb.gpus {
		return ra.gpus > rb.gpus
	}
	if dv != 0 {
		return dv > 0
	}
	return a.Fingerprint < b.Fingerprint
}

// layoutFit says why no node of l can take the pod; fits if one can.
func (r *request) layoutFit(pod *corev1.Pod, l *Layout) misfit {
	// A remembered layout has no node to ask, and its memory records no
	// resources: it stays a candidate, as its pool's next node is
	// expected to offer what its nodes did.
	need := &r.need
	if l.Remembered != nil {
		need = nil
	}
	nodes, m := candidateNodes(pod, l)
	if need != nil && m.kind == fits {
		// Most layouts that lack a resource lack it on every node: say so
		// without a scan of thousands of nodes that cannot fit. After
		// nodeName and nodeSelector, as nodeMismatch checks them first.
		if missing := need.layoutLacks(l); len(missing) > 0 {
			nodes, m = nil, misfit{kind: misfitLayoutLacks, missing: missing}
		}
	}
	for _, n := range nodes {
		nm := r.nodeMismatch(pod, n, need)
		if nm.kind == fits {
			return nm
		}
		// The last node's reason stands for the layout, that of a node the
		// pod selects before that of one it does not: what keeps the pod
		// off the nodes it asked for.
		if m.kind == fits || m.kind == misfitSelector || nm.kind != misfitSelector {
			m = nm
		}
	}
	if m.kind == fits {
		m.kind = misfitNoNodes
	}
	return m
}

// candidateNodes narrows a layout's nodes by the pod's nodeName and
// nodeSelector through the layout's lookup, so that a constrained pod does
// not scan thousands of nodes that cannot match; when none can, it says why.
func candidateNodes(pod *corev1.Pod, l *Layout) ([]*NodeInfo, misfit) {
	if pod.Spec.NodeName == "" && len(pod.Spec.NodeSelector) == 0 {
		return l.Nodes, misfit{}
	}
	lk := l.nodeLookup()
	if pod.Spec.NodeName != "" {
		if n, ok := lk.byName[pod.Spec.NodeName]; ok {
			return []*NodeInfo{n}, misfit{}
		}
		return nil, misfit{kind: misfitBound}
	}
	for k, v := range pod.Spec.NodeSelector {
		if _, ok := lk.labels[k][v]; !ok {
			return nil, misfit{kind: misfitSelector}
		}
	}
	return l.Nodes, misfit{}
}

// nodeMismatch says why the pod cannot land on the node; fits if it can.
// need is nil when the node's resources are not to be checked.
func (r *request) nodeMismatch(pod *corev1.Pod, n *NodeInfo, need *gpuNeed) misfit {
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
		return misfit{kind: misfitBound}
	}
	// Label lookups first: most constraints are a nodeSelector, and this
	// check runs for every node of a layout until one fits.
	for k, v := range pod.Spec.NodeSelector {
		if have, ok := n.Labels.Lookup(k); !ok || have != v {
			return misfit{kind: misfitSelector}
		}
	}
	if !r.affinity.matches(n) {
		return misfit{kind: misfitSelector}
	}
	// Before taints: a toleration would not help a node that lacks the
	// resource, so the advice to add one would mislead.
	if need != nil {
		if missing := need.nodeLacks(n.GPUs); len(missing) > 0 {
			return misfit{kind: misfitNodeLacks, missing: missing}
		}
	}
	for i := range n.Taints {
		t := &n.Taints[i]
		// A pod bound by nodeName skips the scheduler, so only NoExecute
		// (which the kubelet enforces) keeps it off the node.
		if t.Effect != corev1.TaintEffectNoExecute && (t.Effect != corev1.TaintEffectNoSchedule || pod.Spec.NodeName != "") {
			continue
		}
		if !corev1helpers.TolerationsTolerateTaint(klog.Background(), pod.Spec.Tolerations, t, false) {
			return misfit{kind: misfitTaint, taint: t}
		}
	}
	return misfit{}
}

// selectorConflict finds a key the pod selects with another value.
func selectorConflict(pod *corev1.Pod, sel map[string]string) (string, bool) {
	for _, k := range sortedKeys(sel) {
		if have, ok := pod.Spec.NodeSelector[k]; ok && have != sel[k] {
			return k, true
		}
	}
	return "", false
}

// nodeAffinity is the pod's required node affinity, matched against the
// index's nodes, which keep no label map: one Node is refilled for each node
// checked, with only the labels the affinity names (it reads no other key),
// not a node's hundred. The pod's nodeSelector is not part of it:
// nodeMismatch looks its labels up first. nil matches every node.
type nodeAffinity struct {
	selector *nodeaffinity.LazyErrorNodeSelector
	keys     []string
	node     corev1.Node
	// cudaGt, when selector is nil, is the one term the CUDA steering
	// gave a pod that had no required affinity: the node's
	// layout.LabelCUDADriverVersionNumber above it, compared as the
	// selector compares Gt, without building a selector per pod.
	cudaGt int64
}

// cudaAffinity is the required affinity of a pod whose only term is the
// one the CUDA steering added (cudaExpression).
func cudaAffinity(gt int) *nodeAffinity {
	return &nodeAffinity{cudaGt: int64(gt)}
}

// newNodeAffinity is the pod's required node affinity; nil when it has none.
func newNodeAffinity(pod *corev1.Pod) *nodeAffinity {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	required := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	na := &nodeAffinity{
		selector: nodeaffinity.NewLazyErrorNodeSelector(required),
		node:     corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}}},
	}
	for _, t := range required.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			na.keys = append(na.keys, e.Key)
		}
	}
	return na
}

// matches reports whether the node satisfies the affinity; a term that does
// not parse matches no node, as the scheduler has it.
func (a *nodeAffinity) matches(n *NodeInfo) bool {
	if a == nil {
		return true
	}
	if a.selector == nil {
		v, ok := n.Labels.Lookup(layout.LabelCUDADriverVersionNumber)
		got, err := strconv.ParseInt(v, 10, 64)
		return ok && err == nil && got > a.cudaGt
	}
	a.node.Name = n.Name
	clear(a.node.Labels)
	for _, k := range a.keys {
		if v, ok := n.Labels.Lookup(k); ok {
			a.node.Labels[k] = v
		}
	}
	ok, _ := a.selector.Match(&a.node)
	return ok
}

// maxWedgedNamed is how many wedged nodes a message names with their reason.
const maxWedgedNamed = 3

// wedgedWhy names the wedged nodes the pod could land on (nodeName,
// nodeSelector, required affinity, taints), with what their probes say, or
// "" if there are none: the pod found no layout, and these nodes are why. A
// wedged node the pod could not use anyway is left out, as it explains
// nothing. Only called when no layout fits: a pod that got a layout is not
// told about wedged nodes it was kept from, which it could not act on.
func (r *request) wedgedWhy(pod *corev1.Pod, need *gpuNeed) string {
	var fit []*WedgedNode
	for _, w := range r.wedged {
		if r.nodeMismatch(pod, w.Node, need).kind == fits {
			fit = append(fit, w)
		}
	}
	if len(fit) == 0 {
		return ""
	}
	names := make([]string, 0, min(len(fit), maxWedgedNamed))
	reasons := make([]string, 0, cap(names))
	for _, w := range fit[:cap(names)] {
		names = append(names, w.Node.Name)
		reasons = append(reasons, w.Node.Name+": "+w.Reason)
	}
	more := ""
	if n := len(fit) - len(names); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	if len(fit) == 1 {
		return fmt.Sprintf("node %s fits the pod but its NVIDIA driver is wedged (%s), so it gets no GPU pod until the driver answers its probe again (a GPU reset or a reboot of the node)",
			names[0], fit[0].Reason)
	}
	return fmt.Sprintf("nodes %s%s fit the pod but their NVIDIA driver is wedged (%s), so they get no GPU pod until the driver answers their probe again (a GPU reset or a reboot of the node)",
		strings.Join(names, ", "), more, strings.Join(reasons, "; "))
}

// layoutDescription names a candidate layout in a denial message.
func layoutDescription(l *Layout) string {
	switch {
	case l.Remembered != nil && l.Remembered.LastSeen.IsZero():
		return fmt.Sprintf("layout %s (driver %s) declared for %s, which has no node", l.Fingerprint, l.Plan.DriverVersion, describePools(l.Pool))
	case l.Remembered != nil:
		return fmt.Sprintf("layout %s (driver %s) remembered for %s, which has no node", l.Fingerprint, l.Plan.DriverVersion, describePools(l.Pool))
	case l.Pool != "":
		return fmt.Sprintf("layout %s (driver %s) of %s (%d nodes)", l.Fingerprint, l.Plan.DriverVersion, describePools(l.Pool), len(l.Nodes))
	}
	return fmt.Sprintf("layout %s (driver %s, %d nodes)", l.Fingerprint, l.Plan.DriverVersion, len(l.Nodes))
}

// untoleratedTaint says which taint keeps the pod off a layout's nodes, and
// how to let it on: the toleration to add, and for a resource the pod asks
// for, what adds it for the user: the ExtendedResourceToleration admission
// plugin (GKE taints its GPU nodes nvidia.com/gpu=present:NoSchedule and runs
// it), or, for a resource the webhook renamed (which the plugin saw under its
// legacy name), the webhook's own renameToleration.
func untoleratedTaint(pod *corev1.Pod, t *corev1.Taint, renamed []corev1.ResourceName) string {
	fix := corev1.Toleration{Key: t.Key, Operator: corev1.TolerationOpExists, Effect: t.Effect}
	msg := fmt.Sprintf("nodes have taint %s the pod does not tolerate (add the toleration %s to the pod", t.ToString(), describeToleration(fix))
	if t.Effect == corev1.TaintEffectNoSchedule && config.IsExtendedResourceName(t.Key) && requestsResource(pod, corev1.ResourceName(t.Key)) {
		if slices.Contains(renamed, corev1.ResourceName(t.Key)) {
			msg += ", or have gpu-injector add it to pods whose legacy resource it renames (resources.renameToleration: " + string(config.RenameTolerationAdd) + " in its configuration)"
		} else {
			msg += ", or enable the API server's ExtendedResourceToleration admission plugin, which adds it to pods that request " + t.Key
		}
	}
	return msg + ")"
}

// poolsHold reports whether the pools of pin (pools.Join) hold every pool of
// an earlier pin: a pod pinned to a pool stays served when a second pool of
// its layout comes up.
func poolsHold(pin, earlier string) bool {
	have := pools.Split(pin)
	for _, k := range pools.Split(earlier) {
		if !slices.Contains(have, k) {
			return false
		}
	}
	return earlier != ""
}

// describePools names the pools of a pin (pools.Join).
func describePools(pin string) string {
	keys := pools.Split(pin)
	if len(keys) == 1 {
		return "pool " + keys[0]
	}
	return "pools " + strings.Join(keys, " and ")
}
