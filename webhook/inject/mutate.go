package inject

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

const (
	envLDLibraryPath = "LD_LIBRARY_PATH"
	volumePrefix     = "gpu-injector-"

	labelPodSecurityEnforce = "pod-security.kubernetes.io/enforce"
)

// WarnPrefix starts every warning and denial gpu-injector writes, so a user
// reading kubectl's output knows whose words they are.
const WarnPrefix = "gpu-injector: "

// Mutate injects a driver layout into in.Pod, in place, and says what it did:
// Result.Edits are the changes and Result.Patch the JSON Patch operations
// that make them on the pod's JSON. It is pure (no API calls, no logging) so
// that the webhook and the offline `gpu-injector mutate` give the same
// answer, and so that running it on its own output changes nothing.
func Mutate(in Input, cfg *config.Configuration) Result {
	pod := in.Pod
	var res Result
	warn := func(format string, args ...any) {
		res.Warnings = append(res.Warnings, WarnPrefix+fmt.Sprintf(format, args...))
	}
	ed := &editor{pod: pod}
	// done answers with the edits made so far: a pod whose only change is a
	// renamed resource is still Injected.
	done := func(reason string) Result {
		res.Decision, res.Reason = DecisionSkipped, reason
		if ed.changed() {
			res.Decision = DecisionInjected
		}
		res.Edits, res.Patch = ed.edits, ed.patch
		return res
	}

	if slices.Contains(cfg.ExcludedNamespaces, pod.Namespace) {
		return Result{Decision: DecisionSkipped, Reason: ReasonExcludedNamespace}
	}
	if v, ok := pod.Annotations[layout.AnnotationInject]; ok && strings.EqualFold(v, "false") {
		return Result{Decision: DecisionSkipped, Reason: ReasonOptOut}
	}

	m := matcher{cfg: cfg, resources: in.GPUResources, claims: in.GPUClaims}
	renamed := m.fixResources(ed, warn)

	targets := m.targetContainers(pod)
	if len(targets) == 0 {
		return done(ReasonNoGPU)
	}

	prev, err := PreviousInjection(pod)
	if err != nil {
		// Without the record, which volumes, mounts and selector are ours is
		// unknown: injecting again could stack a second driver on the first.
		warn("the pod's annotation %s is not one gpu-injector wrote (%v); the pod is left as it is. Remove the annotation to have the driver injected (and the %s* volumes, their mounts and the %s selector, if gpu-injector's earlier injection is still in the pod)",
			layout.AnnotationInjected, err, volumePrefix, layout.LabelFingerprint)
		return done(ReasonAlreadyInjected)
	}
	var ours []string
	if prev != nil {
		ours = prev.Volumes
	}
	legacy := m.legacyMounts(pod, targets, in.Layouts, ours)
	layouts, keepWhy := in.Layouts, ""
	if len(legacy) > 0 && cfg.LegacyMounts == config.LegacyMountsKeep {
		layouts, keepWhy = keepsLegacy(layouts, legacy)
	}
	need := m.requestedGPUResources(pod)

	level := in.NamespaceLabels[labelPodSecurityEnforce]
	forbidsHostPath := level == "baseline" || level == "restricted"
	rt := m.runtimeChoice(pod, targets, in.Layouts, prev, forbidsHostPath, legacy, renamed, &need)
	if rt.layout != nil {
		m.injectRuntime(ed, targets, rt, legacy, warn)
		res = done(ReasonAlreadyInjected)
		if res.Decision == DecisionInjected {
			res.Reason = ""
		}
		res.Layout = rt.layout
		return res
	}
	if _, ok := pod.Annotations[layout.AnnotationRuntimeInject]; ok {
		ed.do(removeAnnotation{key: layout.AnnotationRuntimeInject})
		warn("the pod's annotation %s was removed: only gpu-injector writes it, on pods whose driver the node's NRI plugin mounts (%s)", layout.AnnotationRuntimeInject, rt.why)
	}
	if forbidsHostPath {
		msg := fmt.Sprintf("namespace %q enforces Pod Security level %q, which forbids the hostPath volumes that carry the NVIDIA driver, and the driver cannot be injected at the runtime instead (%s)", pod.Namespace, level, rt.why)
		if cfg.PodSecurity == config.PodSecurityDeny {
			return Result{Decision: DecisionDenied, Reason: WarnPrefix + msg + "; turn on runtime injection (docs/runtime-injection.md), label the namespace pod-security.kubernetes.io/enforce=privileged, or opt the pod out with annotation " + layout.AnnotationInject + `: "false"`, Warnings: res.Warnings}
		}
		warn("%s: the API server will reject this pod", msg)
	}

	chosen, whyNot := chooseLayout(pod, layouts, cfg, prev, in.Seed, renamed, &need)
	// stale is an earlier injection whose layout no longer fits the pod (its
	// nodes are gone, or changed their driver, or a static layout changed):
	// it is replaced, as a fresh pod would be injected, rather than left to
	// pin the pod where no node has those files.
	var stale *layout.Injected
	if prev != nil && (chosen == nil || !injectionFits(prev, chosen)) {
		stale = prev
		chosen, whyNot = chooseLayout(unpinned(pod, prev), layouts, cfg, nil, in.Seed, renamed, &need)
	}
	if cfg.DriverDelivery == config.DeliveryRuntime && chosen != nil && chosen.Static == "" {
		// Only the noLayout action's static layout may still carry hostPath.
		chosen, whyNot = nil, rt.why
	}
	if keepWhy != "" {
		whyNot = keepWhy
	}
	if chosen == nil {
		// A pod pinned by a stale injection is judged without that pin, as
		// its layouts were: wedged nodes carry no fingerprint to match it.
		judged := pod
		if stale != nil {
			judged = unpinned(pod, stale)
		}
		if why := wedgedWhy(judged, in.Wedged, renamed, &need); why != "" {
			whyNot += "; " + why
		}
		switch cfg.NoLayout.Action {
		case config.NoLayoutStatic:
			s, _ := cfg.Static(cfg.NoLayout.StaticLayout)
			if keepWhy != "" {
				if _, why := keepsLegacy([]*Layout{{Static: s.Name, Plan: s.Plan}}, legacy); why != "" {
					return Result{Decision: DecisionDenied, Reason: fmt.Sprintf("%s%s; nor does the static layout %q", WarnPrefix, why, s.Name), Warnings: res.Warnings}
				}
			}
			if k, ok := selectorConflict(pod, s.NodeSelector); ok {
				return Result{
					Decision: DecisionDenied,
					Reason:   fmt.Sprintf("%sno ready GPU node layout fits this pod (%s), and the static layout %q cannot be used: its node selector %s=%s conflicts with the pod's %s=%s", WarnPrefix, whyNot, s.Name, k, s.NodeSelector[k], k, pod.Spec.NodeSelector[k]),
					Warnings: res.Warnings,
				}
			}
			chosen = &Layout{Static: s.Name, Plan: s.Plan, NodeSelector: s.NodeSelector}
			warn("no ready GPU node layout fits this pod (%s); using static layout %q from the configuration", whyNot, s.Name)
		case config.NoLayoutAllow:
			if stale != nil {
				warn("the pod carries the NVIDIA driver %s, %s, and no other ready GPU node layout fits it (%s); admitted unchanged, its nodeSelector keeps it Pending until a node of that layout is ready",
					describeInjected(stale), m.staleWhy(stale), whyNot)
				return done(ReasonNoLayout)
			}
			warn("no ready GPU node layout fits this pod (%s); admitted without the NVIDIA driver", whyNot)
			return done(ReasonNoLayout)
		default:
			if keepWhy != "" {
				return Result{Decision: DecisionDenied, Reason: WarnPrefix + keepWhy + ", or set legacyMounts: " + config.LegacyMountsReplace + " in the webhook's configuration", Warnings: res.Warnings}
			}
			why := "no ready GPU node layout fits this pod: "
			if stale != nil {
				why = fmt.Sprintf("the pod carries the NVIDIA driver %s, %s, and no other ready GPU node layout fits it: ", describeInjected(stale), m.staleWhy(stale))
			}
			return Result{
				Decision: DecisionDenied,
				Reason:   WarnPrefix + why + whyNot + `; check the pod's nodeName, nodeSelector, node affinity and tolerations, or opt the pod out with annotation ` + layout.AnnotationInject + `: "false"`,
				Warnings: res.Warnings,
			}
		}
	}

	if chosen.Plan.RuntimeInjection != "" && cfg.RuntimeInjection == config.RuntimeInjectionSkip {
		if stale != nil {
			// Left alone means as a pod never injected: without the stale
			// driver, its pin and its record.
			m.removeInjection(ed, stale, nil, targets)
			ed.do(removeAnnotation{key: layout.AnnotationInjected})
			warn("the pod carried the NVIDIA driver %s, %s; removed, as %s injects driver %s there (runtimeInjection: %s)",
				describeInjected(stale), m.staleWhy(stale), injectedBy(chosen.Plan.RuntimeInjection), chosen.Plan.DriverVersion, config.RuntimeInjectionSkip)
		}
		return done(ReasonRuntimeInjection)
	}
	if stale != nil {
		m.removeInjection(ed, stale, chosen, targets)
		warn("the pod carried the NVIDIA driver %s, %s; re-injected with driver %s of %s: the volumes, mounts, %s folders and pin gpu-injector had put in follow the new layout, the rest of the pod is as it was",
			describeInjected(stale), m.staleWhy(stale), chosen.Plan.DriverVersion, describeLayout(chosen), envLDLibraryPath)
	}
	if len(legacy) > 0 && cfg.LegacyMounts == config.LegacyMountsReplace {
		replaceLegacy(ed, legacy, chosen, warn)
	}
	if prev == nil || stale != nil {
		poolWarnings(chosen, warn)
	}
	m.inject(ed, targets, chosen, warn)
	res = done(ReasonAlreadyInjected)
	if res.Decision == DecisionInjected {
		res.Reason = ""
	}
	res.Layout = chosen
	return res
}

// poolWarnings tells the user how a pod is pinned when that is not what an
// autoscaler can act on, or when a pool at zero was served from memory.
func poolWarnings(l *Layout, warn func(string, ...any)) {
	if r := l.Remembered; r != nil {
		warn("pool %s has no ready node; injected the layout its nodes published last (driver %s, last seen %s, remembered until %s), so that the autoscaler can add a node for this pod",
			l.Pool, l.Plan.DriverVersion, r.LastSeen.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339))
		return
	}
	if l.Pool == "" && len(l.MixedPools) > 0 {
		warn("pool %s has ready nodes of more than one driver layout (an upgrade under way?): pinned by layout fingerprint, which no autoscaler can create a node for; the pod waits for a node of layout %s with room",
			strings.Join(l.MixedPools, " and "), l.Fingerprint)
	}
}

type matcher struct {
	cfg *config.Configuration
	// resources and claims are Input.GPUResources and Input.GPUClaims.
	resources []string
	claims    []string
}

// isGPU reports whether a resource name is a configured GPU resource, or one
// that a GPU DeviceClass serves.
func (m matcher) isGPU(name corev1.ResourceName) bool {
	return slices.Contains(m.resources, string(name)) || m.cfg.IsGPUResource(string(name))
}

func (m matcher) wantsGPU(c *corev1.Container) bool {
	for _, rc := range c.Resources.Claims {
		if slices.Contains(m.claims, rc.Name) {
			return true
		}
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name, q := range rl {
			if m.isGPU(name) && !q.IsZero() {
				return true
			}
		}
	}
	return false
}

// AllContainers lists every container of the pod, init containers first, as
// the kubelet runs them.
func AllContainers(pod *corev1.Pod) []*corev1.Container {
	out := make([]*corev1.Container, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for _, r := range containerRefs(pod) {
		out = append(out, r.get(pod))
	}
	return out
}

// fixResources renames legacy GPU resources and copies request-only GPU
// resources to limits, which the API server would otherwise reject. A pod
// renamed gets the toleration the ExtendedResourceToleration admission plugin
// would have given it for the new name (resources.renameToleration). It
// returns the names it renamed resources to.
func (m matcher) fixResources(ed *editor, warn func(string, ...any)) []corev1.ResourceName {
	var renamedTo []corev1.ResourceName
	to := corev1.ResourceName(m.cfg.Resources.RenameTo)
	tolerate := m.cfg.Resources.RenameToleration == config.RenameTolerationAdd && config.IsExtendedResourceName(string(to))
	for _, ref := range containerRefs(ed.pod) {
		c := ref.get(ed.pod)
		for _, legacy := range m.cfg.Resources.Legacy {
			from := corev1.ResourceName(legacy)
			renamed := false
			for _, list := range []resourceList{limits, requests} {
				rl := list.of(c)
				q, ok := rl[from]
				if !ok {
					continue
				}
				have, keep := rl[to]
				if keep && have.Cmp(q) != 0 {
					warn("container %q sets both %s=%s and %s=%s; kept %s=%s", c.Name, from, q.String(), to, have.String(), to, have.String())
				}
				ed.do(renameResource{container: ref, list: list, from: from, to: to, quantity: q, keep: keep})
				renamed = true
			}
			if renamed {
				if !slices.Contains(renamedTo, to) {
					renamedTo = append(renamedTo, to)
				}
				tolerated := ""
				if tolerate && !toleratesResource(ed.pod.Spec.Tolerations, to) {
					t := resourceToleration(to)
					ed.do(addToleration{toleration: t})
					tolerated = fmt.Sprintf("; added the toleration %s that the ExtendedResourceToleration admission plugin gives pods requesting %s (it gives none for the legacy name), so the pod may use nodes tainted %s:%s", describeToleration(t), to, to, t.Effect)
				}
				warn("container %q: resource %s renamed to %s (no node offers the legacy name, so the pod would stay Pending forever)%s", c.Name, from, to, tolerated)
				// Extended resources need request == limit; a rename that met
				// an existing, different value must not break that.
				lim, hasLim := c.Resources.Limits[to]
				if req, ok := c.Resources.Requests[to]; ok && hasLim && req.Cmp(lim) != 0 {
					ed.do(setResource{container: ref, list: requests, name: to, quantity: lim})
					warn("container %q: request %s=%s set to its limit %s", c.Name, to, req.String(), lim.String())
				}
			}
		}
		for _, name := range sortedResourceNames(c.Resources.Requests) {
			q := c.Resources.Requests[name]
			if !m.isGPU(name) {
				continue
			}
			if _, ok := c.Resources.Limits[name]; ok {
				continue
			}
			ed.do(setResource{container: ref, list: limits, name: name, quantity: q})
			warn("container %q requests %s=%s without a limit; copied it to limits (GPUs cannot be overcommitted, so the API server requires a limit)", c.Name, name, q.String())
		}
	}
	return renamedTo
}

// resourceToleration is what the ExtendedResourceToleration admission plugin
// adds to a pod that requests the extended resource name. Exactly that: when
// the API server reinvokes its admission plugins after the webhook changed
// the pod, the plugin finds it there and adds no second one.
func resourceToleration(name corev1.ResourceName) corev1.Toleration {
	return corev1.Toleration{Key: string(name), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
}

// toleratesResource reports whether the tolerations let the pod onto every
// node tainted NoSchedule with the resource's name as key, whatever the
// taint's value: what resourceToleration would add is already covered.
func toleratesResource(tolerations []corev1.Toleration, name corev1.ResourceName) bool {
	for _, t := range tolerations {
		if t.Operator == corev1.TolerationOpExists && (t.Key == "" || t.Key == string(name)) &&
			(t.Effect == "" || t.Effect == corev1.TaintEffectNoSchedule) {
			return true
		}
	}
	return false
}

// describeToleration writes a toleration as a user would in a manifest.
func describeToleration(t corev1.Toleration) string {
	return fmt.Sprintf("{key: %s, operator: %s, effect: %s}", t.Key, t.Operator, t.Effect)
}

// requestsResource reports whether a container or init container of the pod
// asks for the resource, in its limits or requests.
func requestsResource(pod *corev1.Pod, name corev1.ResourceName) bool {
	for _, r := range containerRefs(pod) {
		c := r.get(pod)
		_, inLimits := c.Resources.Limits[name]
		_, inRequests := c.Resources.Requests[name]
		if inLimits || inRequests {
			return true
		}
	}
	return false
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
			msg += ", or have gpu-injector add it to pods whose legacy resource it renames (resources.renameToleration: " + config.RenameTolerationAdd + " in its configuration)"
		} else {
			msg += ", or enable the API server's ExtendedResourceToleration admission plugin, which adds it to pods that request " + t.Key
		}
	}
	return msg + ")"
}

func (m matcher) targetContainers(pod *corev1.Pod) []containerRef {
	var gpu []containerRef
	all := containerRefs(pod)
	for _, r := range all {
		if m.wantsGPU(r.get(pod)) {
			gpu = append(gpu, r)
		}
	}
	if len(gpu) == 0 || m.cfg.Containers != config.ContainersAll {
		return gpu
	}
	return all
}

// chooseLayout returns the layout for the pod, or nil and why none fits.
//
// Policy MostGPUs: among layouts with at least one ready node the pod may land
// on (nodeName, nodeSelector, required node affinity, the GPU resources it
// requests, NoSchedule/NoExecute taints), the one with the most allocatable
// GPUs of the resources the pod requests, then the newest driver, then the
// smallest fingerprint so that replicas agree. NewestDriver swaps the first
// two keys. A pod injected before keeps its layout while that fits it
// (Mutate re-injects it once it no longer does). renamed are the resources
// fixResources renamed to, for the advice on a taint; need is what the pod
// requests.
func chooseLayout(pod *corev1.Pod, layouts []*Layout, cfg *config.Configuration, prev *layout.Injected, seed uint64, renamed []corev1.ResourceName, need *gpuNeed) (*Layout, string) {
	if prev != nil && prev.StaticLayout != "" {
		if s, ok := cfg.Static(prev.StaticLayout); ok {
			return &Layout{Static: s.Name, Plan: s.Plan, NodeSelector: s.NodeSelector}, ""
		}
		return nil, "static layout " + prev.StaticLayout + " is gone"
	}
	if len(layouts) == 0 {
		return nil, "no GPU node publishes a ready layout"
	}
	order := make([]rankedLayout, len(layouts))
	for i, l := range layouts {
		order[i] = rankedLayout{l, need.gpus(l)}
	}
	// SortStableFunc rather than sort.SliceStable: no reflection, no
	// allocation, on every request.
	slices.SortStableFunc(order, func(a, b rankedLayout) int {
		switch {
		case better(a, b, cfg.LayoutPolicy):
			return -1
		case better(b, a, cfg.LayoutPolicy):
			return 1
		}
		return 0
	})

	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var match *affinityNode
	if hasRequiredAffinity(pod) {
		match = newAffinityNode(pod)
	}
	spread := cfg.LayoutPolicy == config.LayoutPolicySpread && prev == nil
	var reasons []string
	var fits []rankedLayout
	var weight uint64
	for _, r := range order {
		l := r.layout
		if prev != nil && (l.Fingerprint != prev.Fingerprint || (l.Pool != "" && l.Pool != prev.Pool)) {
			continue
		}
		if spread && l.Remembered != nil && len(fits) > 0 {
			break
		}
		why := layoutFit(pod, l, affinity, match, renamed, need)
		if why == "" {
			if !spread {
				return l, ""
			}
			fits = append(fits, r)
			weight += uint64(max(r.gpus, 1))
			continue
		}
		if len(reasons) < 5 {
			reasons = append(reasons, layoutDescription(l)+": "+why)
		}
	}
	if len(fits) > 0 {
		// Weighted by GPUs, in the policy's order, so the same seed always
		// picks the same layout.
		pick := seed % weight
		for _, r := range fits {
			w := uint64(max(r.gpus, 1))
			if pick < w {
				return r.layout, ""
			}
			pick -= w
		}
	}
	if prev != nil {
		return nil, ""
	}
	if len(order) > len(reasons) {
		reasons = append(reasons, fmt.Sprintf("and %d more layouts", len(order)-len(reasons)))
	}
	return nil, strings.Join(reasons, "; ")
}

// layoutFit says why no node of l can take the pod, or "" if one can.
func layoutFit(pod *corev1.Pod, l *Layout, affinity nodeaffinity.RequiredNodeAffinity, match *affinityNode, renamed []corev1.ResourceName, need *gpuNeed) string {
	// A remembered layout has no node to ask, and its memory records no
	// resources: it stays a candidate, as its pool's next node is
	// expected to offer what its nodes did.
	nodeNeed := need
	if l.Remembered != nil {
		nodeNeed = nil
	}
	nodes, why := candidateNodes(pod, l)
	if nodeNeed != nil && why == "" {
		// Most layouts that lack a resource lack it on every node: say so
		// without a scan of thousands of nodes that cannot fit. After
		// nodeName and nodeSelector, as nodeMismatch checks them first.
		if missing := nodeNeed.layoutLacks(l); len(missing) > 0 {
			nodes, why = nil, "no node offers "+describeResources(missing)
		}
	}
	for _, n := range nodes {
		nodeWhy := nodeMismatch(pod, affinity, match, n, renamed, nodeNeed)
		if nodeWhy == "" {
			return ""
		}
		// A node the pod selects says more than one it does not: what
		// keeps the pod off the nodes it asked for.
		if why == "" || why == whySelector || nodeWhy != whySelector {
			why = nodeWhy
		}
	}
	if why == "" {
		why = "no ready nodes"
	}
	return why
}

// maxWedgedNamed is how many wedged nodes a message names with their reason.
const maxWedgedNamed = 3

// wedgedWhy names the wedged nodes the pod could land on (nodeName,
// nodeSelector, required affinity, taints), with what their probes say, or
// "" if there are none: the pod found no layout, and these nodes are why. A
// wedged node the pod could not use anyway is left out, as it explains
// nothing. Only called when no layout fits: a pod that got a layout is not
// told about wedged nodes it was kept from, which it could not act on.
func wedgedWhy(pod *corev1.Pod, wedged []*WedgedNode, renamed []corev1.ResourceName, need *gpuNeed) string {
	if len(wedged) == 0 {
		return ""
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var match *affinityNode
	if hasRequiredAffinity(pod) {
		match = newAffinityNode(pod)
	}
	var fit []*WedgedNode
	for _, w := range wedged {
		if nodeMismatch(pod, affinity, match, w.Node, renamed, need) == "" {
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
	case l.Remembered != nil:
		return fmt.Sprintf("layout %s (driver %s) remembered for pool %s, which has no node", l.Fingerprint, l.Plan.DriverVersion, l.Pool)
	case l.Pool != "":
		return fmt.Sprintf("layout %s (driver %s) of pool %s (%d nodes)", l.Fingerprint, l.Plan.DriverVersion, l.Pool, len(l.Nodes))
	}
	return fmt.Sprintf("layout %s (driver %s, %d nodes)", l.Fingerprint, l.Plan.DriverVersion, len(l.Nodes))
}

// candidateNodes narrows a layout's nodes by the pod's nodeName and
// nodeSelector through the layout's lookup, so that a constrained pod does
// not scan thousands of nodes that cannot match; when none can, it says why.
func candidateNodes(pod *corev1.Pod, l *Layout) ([]*NodeInfo, string) {
	if pod.Spec.NodeName == "" && len(pod.Spec.NodeSelector) == 0 {
		return l.Nodes, ""
	}
	lk := l.nodeLookup()
	if pod.Spec.NodeName != "" {
		if n, ok := lk.byName[pod.Spec.NodeName]; ok {
			return []*NodeInfo{n}, ""
		}
		return nil, fmt.Sprintf("pod is bound to node %q", pod.Spec.NodeName)
	}
	for k, v := range pod.Spec.NodeSelector {
		if _, ok := lk.labels[k][v]; !ok {
			return nil, whySelector
		}
	}
	return l.Nodes, ""
}

// whySelector is nodeMismatch's reason for a node the pod does not select.
const whySelector = "no node matches the pod's nodeSelector or required node affinity"

// nodeMismatch says why the pod cannot land on the node, or "" if it can.
// The last node's reason stands for the layout in a denial message, that of
// a node the pod selects before that of one it does not.
// match is set if the pod has required node affinity; need is nil when the
// node's resources are not to be checked.
func nodeMismatch(pod *corev1.Pod, affinity nodeaffinity.RequiredNodeAffinity, match *affinityNode, n *NodeInfo, renamed []corev1.ResourceName, need *gpuNeed) string {
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
		return fmt.Sprintf("pod is bound to node %q", pod.Spec.NodeName)
	}
	// Label lookups first: most constraints are a nodeSelector, and this
	// check runs for every node of a layout until one fits.
	for k, v := range pod.Spec.NodeSelector {
		if have, ok := n.Labels.Lookup(k); !ok || have != v {
			return whySelector
		}
	}
	if match != nil {
		if ok, _ := affinity.Match(match.of(n)); !ok {
			return whySelector
		}
	}
	// Before taints: a toleration would not help a node that lacks the
	// resource, so the advice to add one would mislead.
	if need != nil {
		if missing := need.nodeLacks(n.GPUs); len(missing) > 0 {
			return "no node the pod may land on offers " + describeResources(missing)
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
			return untoleratedTaint(pod, t, renamed)
		}
	}
	return ""
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

// affinityNode is the Node the node affinity matcher reads, which wants a
// label map: the index keeps none, so one map is refilled for each node
// checked, with only the labels the pod's selectors name (a selector reads no
// other key), not a node's hundred.
type affinityNode struct {
	node corev1.Node
	keys []string
}

func newAffinityNode(pod *corev1.Pod) *affinityNode {
	a := &affinityNode{node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}}}}
	for k := range pod.Spec.NodeSelector {
		a.keys = append(a.keys, k)
	}
	for _, t := range pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			a.keys = append(a.keys, e.Key)
		}
	}
	return a
}

// of is n as the matcher reads it; valid until the next call.
func (a *affinityNode) of(n *NodeInfo) *corev1.Node {
	a.node.Name = n.Name
	clear(a.node.Labels)
	for _, k := range a.keys {
		if v, ok := n.Labels.Lookup(k); ok {
			a.node.Labels[k] = v
		}
	}
	return &a.node
}

func hasRequiredAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	return a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil
}

// rankedLayout is a layout and its GPUs of the resources the pod requests,
// which the policy weighs.
type rankedLayout struct {
	layout *Layout
	gpus   int64
}

func better(ra, rb rankedLayout, policy string) bool {
	a, b := ra.layout, rb.layout
	// A pool at zero only when no node up now fits: the pod should not wait
	// for a scale-up while a node could run it.
	if (a.Remembered == nil) != (b.Remembered == nil) {
		return a.Remembered == nil
	}
	dv := layout.CompareVersions(a.Plan.DriverVersion, b.Plan.DriverVersion)
	if policy == config.LayoutPolicyNewestDriver && dv != 0 {
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

// volumeName is stable for a mount, so a second run finds its own volumes;
// 96 bits, so that a node cannot pick paths whose names collide.
func volumeName(mt layout.Mount) string {
	sum := sha256.Sum256([]byte(mt.HostPath + "\x00" + mt.ContainerPath))
	return volumePrefix + hex.EncodeToString(sum[:12])
}

func (m matcher) inject(ed *editor, targets []containerRef, l *Layout, warn func(string, ...any)) {
	pod := ed.pod
	volumes := make(map[string]int, len(pod.Spec.Volumes))
	for i, v := range pod.Spec.Volumes {
		volumes[v.Name] = i
	}
	ours := l.preparedMounts()
	names := make([]string, 0, len(ours))
	cloned := false
	for i := range ours {
		want := ours[i].volume
		name := want.Name
		// A user volume may hold our name by chance: find a free one.
		for k := 2; ; k++ {
			j, taken := volumes[name]
			if (!taken || apiequalHostPath(pod.Spec.Volumes[j], want)) && !slices.Contains(names, name) {
				break
			}
			name = fmt.Sprintf("%s-%d", want.Name, k)
		}
		if name != want.Name {
			if !cloned {
				// The layout's prepared mounts are shared by every request.
				ours, cloned = slices.Clone(ours), true
			}
			pm := &ours[i]
			pm.volume.Name, pm.use = name, readOnlyUse(name, pm.mount.ContainerPath)
			pm.volumeJSON, pm.useJSON = nil, nil
		}
		names = append(names, name)
	}

	// Room for every edit of a pod that has none of our mounts yet.
	pod.Spec.Volumes = slices.Grow(pod.Spec.Volumes, len(ours))
	ed.patch = slices.Grow(ed.patch, (len(targets)+1)*(len(ours)+1)+3)
	ed.edits = slices.Grow(ed.edits, (len(targets)+1)*(len(ours)+1)+3)
	used := make(map[string]bool, len(ours))
	containerNames := make([]string, 0, len(targets))
	for _, ref := range targets {
		c := ref.get(pod)
		c.VolumeMounts = slices.Grow(c.VolumeMounts, len(ours))
		containerNames = append(containerNames, c.Name)
		list := ref.path() + "/volumeMounts"
		for i := range ours {
			mt, name := ours[i].mount, ours[i].volume.Name
			if hasMount(c, name, mt.ContainerPath) {
				used[name] = true
				continue
			}
			if other := shadowingMount(c, mt.ContainerPath, names); other != nil {
				if other.MountPath == mt.ContainerPath {
					warn("container %q already mounts %s (volume %q); left as is, not mounted twice", c.Name, other.MountPath, other.Name)
				} else {
					warn("container %q already mounts %s (volume %q); %s not mounted inside it", c.Name, other.MountPath, other.Name, mt.ContainerPath)
				}
				continue
			}
			ed.do(addMount{container: ref, mount: &ours[i].use, prepared: ours[i].useJSON, list: list})
			used[name] = true
		}
		m.mergeLDLibraryPath(ed, ref, l.Plan.LibraryPaths, warn)
	}

	var injected []string
	for i := range ours {
		v := &ours[i].volume
		if !used[v.Name] {
			continue
		}
		injected = append(injected, v.Name)
		if _, ok := volumes[v.Name]; ok {
			continue
		}
		ed.do(addVolume{volume: v, prepared: ours[i].volumeJSON})
		volumes[v.Name] = len(pod.Spec.Volumes) - 1
	}

	forceReadOnly(ed, injected, warn)

	// A static layout and a pool bring their own selector; the pool's labels
	// are ones the autoscaler knows, so it can add a node for the pod.
	selector := l.NodeSelector
	if l.Static == "" && l.Pool == "" {
		selector = map[string]string{layout.LabelFingerprint: l.Fingerprint}
	}
	for _, k := range sortedKeys(selector) {
		v := selector[k]
		if have, ok := pod.Spec.NodeSelector[k]; ok {
			if have != v {
				warn("pod's nodeSelector %s=%s conflicts with the layout's %s=%s; kept the pod's", k, have, k, v)
			}
			continue
		}
		ed.do(addNodeSelector{key: k, value: v})
	}

	if l.Pool != "" && ed.pod.Labels[layout.LabelPinnedLayout] != l.Fingerprint {
		// Lets the elected replica find a pod that lands on a node of the
		// pool with another layout, watching only such pods.
		ed.do(setLabel{key: layout.LabelPinnedLayout, value: l.Fingerprint})
	}

	marker := layout.Injected{
		Fingerprint:   l.Fingerprint,
		StaticLayout:  l.Static,
		DriverVersion: l.Plan.DriverVersion,
		Containers:    containerNames,
		Volumes:       injected,
		Pool:          l.Pool,
		Remembered:    l.Remembered != nil,
	}.String()
	if pod.Annotations[layout.AnnotationInjected] != marker {
		ed.do(setAnnotation{key: layout.AnnotationInjected, value: marker})
	}
}

// forceReadOnly makes every mount of an injected volume read-only, in every
// kind of container: the names are predictable, and a hostPath volume has no
// read-only flag of its own, so a mount the user (or another webhook) wrote
// could otherwise reach the host's driver read-write.
func forceReadOnly(ed *editor, ours []string, warn func(string, ...any)) {
	pod := ed.pod
	fix := func(kind string, ref containerRef) {
		c := ref.get(pod)
		for i := range c.VolumeMounts {
			vm := &c.VolumeMounts[i]
			if !slices.Contains(ours, vm.Name) || vm.ReadOnly {
				continue
			}
			ed.do(readOnlyMount{container: ref, index: i})
			warn("%s %q mounts the injected volume %q read-write at %s; made it read-only", kind, c.Name, vm.Name, vm.MountPath)
		}
	}
	for i := range pod.Spec.InitContainers {
		fix("init container", containerRef{initContainers, i})
	}
	for i := range pod.Spec.Containers {
		fix("container", containerRef{appContainers, i})
	}
	for i := range pod.Spec.EphemeralContainers {
		fix("ephemeral container", containerRef{ephemeralContainers, i})
	}
}

func hostPathVolume(mt layout.Mount) corev1.Volume {
	t := corev1.HostPathDirectory
	if mt.Kind == layout.KindFile {
		t = corev1.HostPathFile
	}
	return corev1.Volume{VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: mt.HostPath, Type: &t}}}
}

// readOnlyUse is how every container mounts an injected volume.
func readOnlyUse(volume, mountPath string) corev1.VolumeMount {
	return corev1.VolumeMount{Name: volume, MountPath: mountPath, ReadOnly: true, RecursiveReadOnly: ptr.To(corev1.RecursiveReadOnlyIfPossible)}
}

func apiequalHostPath(have, want corev1.Volume) bool {
	h, w := have.HostPath, want.HostPath
	return h != nil && h.Path == w.Path && h.Type != nil && *h.Type == *w.Type
}

func hasMount(c *corev1.Container, volume, mountPath string) bool {
	for _, vm := range c.VolumeMounts {
		if vm.Name == volume && vm.MountPath == mountPath {
			return true
		}
	}
	return false
}

// shadowingMount finds a mount of the user's at p or at a folder above it,
// which our mount would either duplicate or be hidden by.
func shadowingMount(c *corev1.Container, p string, ours []string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		if slices.Contains(ours, vm.Name) {
			continue
		}
		mp := path.Clean(vm.MountPath)
		if mp == p || strings.HasPrefix(p, mp+"/") {
			return vm
		}
	}
	return nil
}

// mergeLDLibraryPath adds the layout's library folders to the container's
// LD_LIBRARY_PATH without dropping what the spec already sets.
func (m matcher) mergeLDLibraryPath(ed *editor, ref containerRef, libs []string, warn func(string, ...any)) {
	if m.cfg.LDLibraryPath == config.LDLibraryPathOff || len(libs) == 0 {
		return
	}
	c := ref.get(ed.pod)
	idx := -1
	for i, e := range c.Env {
		if e.Name == envLDLibraryPath {
			idx = i
		}
	}
	if idx < 0 {
		value := strings.Join(libs, ":")
		if len(c.EnvFrom) > 0 {
			// env overrides envFrom: refer to the envFrom value, which the
			// kubelet expands, so a value set there is kept, not replaced.
			fromEnv := "$(" + envLDLibraryPath + ")"
			if m.cfg.LDLibraryPath == config.LDLibraryPathPrepend {
				value += ":" + fromEnv
			} else {
				value = fromEnv + ":" + value
			}
			warn("container %q takes env from envFrom, which may set %s: set it to %q so the kubelet keeps that value", c.Name, envLDLibraryPath, value)
		}
		ed.do(addEnv{container: ref, env: corev1.EnvVar{Name: envLDLibraryPath, Value: value}})
		return
	}
	e := &c.Env[idx]
	if e.ValueFrom != nil {
		warn("container %q takes %s from a reference; left as is, add %s to it yourself", c.Name, envLDLibraryPath, strings.Join(libs, ":"))
		return
	}
	have := strings.Split(e.Value, ":")
	var missing []string
	for _, l := range libs {
		if !slices.Contains(have, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) == 0 {
		return
	}
	old, value := e.Value, ""
	switch {
	case old == "":
		value = strings.Join(missing, ":")
	case m.cfg.LDLibraryPath == config.LDLibraryPathPrepend:
		value = strings.Join(missing, ":") + ":" + old
	default:
		value = old + ":" + strings.Join(missing, ":")
	}
	ed.do(setEnvValue{container: ref, index: idx, value: value})
	warn("container %q: %s %q merged with the driver's folders: %q", c.Name, envLDLibraryPath, old, value)
}

func sortedResourceNames(rl corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(rl))
	for n := range rl {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Seed turns a request's UID (or, offline, a document's name) into the
// Spread policy's seed.
func Seed(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}
