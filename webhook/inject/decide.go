package inject

import (
	"fmt"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// outcome is what the decision does with a pod.
type outcome uint8

const (
	// outcomeSkip leaves the pod as it came.
	outcomeSkip outcome = iota
	// outcomeAdmit admits the pod without the driver, with the changes it
	// needs whatever the driver: legacy resources renamed, a runtime marker
	// gpu-injector did not write, or a stale injection, taken out.
	outcomeAdmit
	// outcomeInject gives the pod the driver; the delivery says how.
	outcomeInject
	// outcomeDeny rejects the pod, which is left as it came.
	outcomeDeny
)

var outcomeNames = [...]string{"skip", "admit", "inject", "deny"}

func (o outcome) String() string { return outcomeNames[o] }

// reason is why a pod is skipped, admitted without the driver or denied: a
// code, from which and the decision's details the user's message is made.
type reason uint8

const (
	reasonNone reason = iota
	reasonExcludedNamespace
	reasonOptOut
	reasonNoGPU
	// reasonUnreadableRecord: the pod's injection record is not one
	// gpu-injector wrote, so what an earlier injection put in is unknown.
	reasonUnreadableRecord
	reasonNoLayout
	reasonRuntimeInjection
	// reasonPodSecurity: the namespace forbids hostPath volumes and the NRI
	// plugin cannot serve the pod.
	reasonPodSecurity
	// reasonLegacyKept: legacyMounts Keep, and no layout has the host paths
	// the pod mounts by hand.
	reasonLegacyKept
	// reasonStaticLacksLegacy: as reasonLegacyKept, and the static layout of
	// noLayout lacks them too.
	reasonStaticLacksLegacy
	// reasonStaticConflict: the static layout of noLayout selects nodes the
	// pod's nodeSelector rules out.
	reasonStaticConflict
	// reasonTooManyContainers, reasonPatchTooLarge: past config.Limits.
	reasonTooManyContainers
	reasonPatchTooLarge
	// reasonCanceled: the caller gave up on the request.
	reasonCanceled
	// reasonCUDAUnserved: the pod requires a CUDA version that no node's
	// driver supports.
	reasonCUDAUnserved
	// reasonAdmittedByPolicy: the chart's MutatingAdmissionPolicy admitted
	// the pod, or its author wrote the policy's label to opt it out.
	reasonAdmittedByPolicy
)

// labels are the Result.Reason of a pod that is not denied, which the
// skipped-pods metric counts by.
var reasonLabels = [...]string{
	reasonExcludedNamespace: ReasonExcludedNamespace,
	reasonOptOut:            ReasonOptOut,
	reasonNoGPU:             ReasonNoGPU,
	reasonUnreadableRecord:  ReasonAlreadyInjected,
	reasonNoLayout:          ReasonNoLayout,
	reasonRuntimeInjection:  ReasonRuntimeInjection,
	reasonPodSecurity:       "pod-security",
	reasonLegacyKept:        "legacy-kept",
	reasonStaticLacksLegacy: "static-lacks-legacy",
	reasonStaticConflict:    "static-conflict",
	reasonTooManyContainers: "too-many-containers",
	reasonPatchTooLarge:     "patch-too-large",
	reasonCanceled:          "canceled",
	reasonCUDAUnserved:      "cuda-unserved",
	reasonAdmittedByPolicy:  ReasonAdmittedByPolicy,
}

func (c reason) String() string { return reasonLabels[c] }

// delivery is how the driver reaches the pod's containers.
type delivery uint8

const (
	deliveryNone delivery = iota
	// deliveryHostPath: the layout's hostPath volumes, and a pin on its nodes.
	deliveryHostPath
	// deliveryNodeRuntime: the layout's nodes inject the driver themselves
	// (their device plugin or container toolkit, Plan.RuntimeInjection); the
	// pod gets the pin, LD_LIBRARY_PATH and the record, no volume.
	deliveryNodeRuntime
	// deliveryNRI: the NRI plugin of the node the pod lands on mounts that
	// node's driver when the container is created.
	deliveryNRI
)

var deliveryNames = [...]string{"none", "hostPath", "nodeRuntime", "nri"}

func (d delivery) String() string { return deliveryNames[d] }

// decision is what decide makes of a request, before anything of the pod
// is changed.
type decision struct {
	outcome  outcome
	reason   reason
	delivery delivery
	// layout is what the pod is injected with; with reasonRuntimeInjection,
	// the layout whose nodes inject the driver themselves.
	layout *Layout
	// runtime is the NRI plugin's injection (deliveryNRI), or why the plugin
	// does not serve the pod.
	runtime runtimeDecision
	// stale is an earlier injection whose layout no longer fits the pod:
	// taken out of an admitted or injected pod, named in a denial.
	stale *layout.Injected
	// dropRecord: the pod carries a record of a runtime injection that it
	// does not bear out (believeRuntimeRecord), and gets no driver: it goes.
	dropRecord bool
	// dropMarker: the pod carries the NRI plugin's marker, which only
	// gpu-injector writes and only on pods the plugin serves; it goes.
	dropMarker bool
	// whyNot says why no layout fits the pod.
	whyNot string
	// static is noLayout's static layout, of a denial that names it;
	// conflict is the nodeSelector key it conflicts on.
	static   *config.StaticLayout
	conflict string
	// warnings are the decision's own, without the edits' (see apply).
	warnings []string
	// patchOps and patchBytes estimate the patch of reasonPatchTooLarge.
	patchOps, patchBytes int
}

func (d *decision) warn(format string, args ...any) {
	d.warnings = append(d.warnings, WarnPrefix+fmt.Sprintf(format, args...))
}

func (d *decision) deny(c reason) {
	d.outcome, d.reason = outcomeDeny, c
}

// decide is the decision on a request, kept apart from the edits as istio
// keeps injectRequired apart from injectPod: whether the pod gets the
// driver, how and from which layout, or why it is skipped, admitted without
// it or denied. It changes nothing of the pod; apply makes the edits.
func (r *request) decide() decision {
	switch {
	case r.exempt != reasonNone:
		return decision{outcome: outcomeSkip, reason: r.exempt}
	case r.tooMany:
		return decision{outcome: outcomeDeny, reason: reasonTooManyContainers}
	case len(r.targets) == 0:
		return r.withoutDriver(decision{reason: reasonNoGPU})
	case r.prevErr != nil:
		return r.unreadableRecord()
	case r.cudaUnserved():
		return decision{outcome: outcomeDeny, reason: reasonCUDAUnserved}
	}
	rt := r.runtimeChoice()
	if rt.layout != nil {
		return decision{outcome: outcomeInject, delivery: deliveryNRI, layout: rt.layout, runtime: rt}
	}
	return r.decideLayout(rt)
}

// withoutDriver admits the pod without the driver: as it came, unless it
// needs changes anyway.
func (r *request) withoutDriver(d decision) decision {
	d.outcome = outcomeSkip
	d.dropRecord = r.forged && d.stale == nil
	if len(r.fixes) > 0 || d.dropMarker || d.stale != nil || d.dropRecord {
		d.outcome = outcomeAdmit
	}
	return d
}

// decideLayout chooses the layout whose hostPath volumes (or whose nodes'
// own runtime) give the pod its driver, when the NRI plugin does not.
func (r *request) decideLayout(rt runtimeDecision) decision {
	_, marked := r.view.Annotations[layout.AnnotationRuntimeInject]
	d := decision{runtime: rt, dropMarker: marked}
	if r.hostPathForbidden() {
		if r.cfg.PodSecurity == config.PodSecurityDeny {
			d.deny(reasonPodSecurity)
			return d
		}
		d.warn("%s: the API server will reject this pod", r.podSecurityWhy(rt))
	}
	ch := r.choose(rt)
	d.stale, d.whyNot = ch.stale, ch.whyNot
	chosen := ch.layout
	if chosen == nil {
		if chosen = r.noLayout(&d, ch.legacyUnheld); chosen == nil {
			return d
		}
	}
	d.layout = chosen
	if chosen.Plan.RuntimeInjection != "" && r.cfg.RuntimeInjection == config.RuntimeInjectionSkip {
		d.reason = reasonRuntimeInjection
		return r.withoutDriver(d)
	}
	d.outcome, d.delivery = outcomeInject, deliveryHostPath
	if chosen.Plan.RuntimeInjection != "" {
		d.delivery = deliveryNodeRuntime
	}
	return d
}

// noLayout applies the noLayout action to a pod no layout fits: the static
// layout it names, or d becomes an admission without the driver or a
// denial (and nil is returned).
func (r *request) noLayout(d *decision, legacyUnheld bool) *Layout {
	switch r.cfg.NoLayout.Action {
	case config.NoLayoutStatic:
		s, _ := r.cfg.Static(r.cfg.NoLayout.StaticLayout)
		d.static = s
		if legacyUnheld && !holdsLegacy(s.Plan, r.legacy) {
			d.deny(reasonStaticLacksLegacy)
			return nil
		}
		if k, ok := selectorConflict(r.view, s.NodeSelector); ok {
			d.conflict = k
			d.deny(reasonStaticConflict)
			return nil
		}
		d.warn("no ready GPU node layout fits this pod (%s); using static layout %q from the configuration", d.whyNot, s.Name)
		return &Layout{Static: s.Name, Plan: s.Plan, NodeSelector: s.NodeSelector}
	case config.NoLayoutAllow:
		if s := d.stale; s != nil {
			d.warn("the pod carries the NVIDIA driver %s, %s, and no other ready GPU node layout fits it (%s); admitted unchanged, its nodeSelector keeps it Pending until a node of that layout is ready",
				describeInjected(s), r.staleWhy(s), d.whyNot)
		} else {
			d.warn("no ready GPU node layout fits this pod (%s); admitted without the NVIDIA driver", d.whyNot)
		}
		// Admitted as it is: the stale injection stays, and keeps the pin.
		d.stale, d.reason = nil, reasonNoLayout
		*d = r.withoutDriver(*d)
		return nil
	}
	if legacyUnheld {
		d.deny(reasonLegacyKept)
	} else {
		d.deny(reasonNoLayout)
	}
	return nil
}

// denial is the message of a denied pod, made from its reason and the
// decision's details.
func (r *request) denial(d decision) string {
	const fixAdvice = `; check the pod's nodeName, nodeSelector, node affinity and tolerations, or opt the pod out with annotation ` + layout.AnnotationInject + `: "false"`
	switch d.reason {
	case reasonTooManyContainers, reasonPatchTooLarge, reasonCanceled:
		return r.limitWhy(d)
	case reasonCUDAUnserved:
		return r.cudaDenial()
	case reasonPodSecurity:
		return r.podSecurityWhy(d.runtime) + "; turn on runtime injection (docs/runtime-injection.md), label the namespace pod-security.kubernetes.io/enforce=privileged, or opt the pod out with annotation " + layout.AnnotationInject + `: "false"`
	case reasonLegacyKept:
		return legacyKeptWhy(r.legacy) + ", or set legacyMounts: " + string(config.LegacyMountsReplace) + " in the webhook's configuration"
	case reasonStaticLacksLegacy:
		return fmt.Sprintf("%s; nor does the static layout %q", legacyKeptWhy(r.legacy), d.static.Name)
	case reasonStaticConflict:
		k := d.conflict
		return fmt.Sprintf("no ready GPU node layout fits this pod (%s), and the static layout %q cannot be used: its node selector %s=%s conflicts with the pod's %s=%s",
			d.whyNot, d.static.Name, k, d.static.NodeSelector[k], k, r.view.Spec.NodeSelector[k])
	}
	if s := d.stale; s != nil {
		return fmt.Sprintf("the pod carries the NVIDIA driver %s, %s, and no other ready GPU node layout fits it: ", describeInjected(s), r.staleWhy(s)) + d.whyNot + fixAdvice
	}
	return "no ready GPU node layout fits this pod: " + d.whyNot + fixAdvice
}

// hostPathForbidden reports whether the namespace's Pod Security level
// forbids hostPath volumes.
func (r *request) hostPathForbidden() bool {
	return r.podSecurity == "baseline" || r.podSecurity == "restricted"
}

func (r *request) podSecurityWhy(rt runtimeDecision) string {
	return fmt.Sprintf("namespace %q enforces Pod Security level %q, which forbids the hostPath volumes that carry the NVIDIA driver, and the driver cannot be injected at the runtime instead (%s)",
		r.view.Namespace, r.podSecurity, rt.whyNot())
}

// choice is the layout choose found, or why there is none.
type choice struct {
	layout *Layout
	// stale is the pod's earlier injection, when its layout no longer fits
	// the pod (its nodes are gone, or changed their driver, or a static
	// layout changed): it is replaced, as a fresh pod would be injected,
	// rather than left to pin the pod where no node has those files.
	stale  *layout.Injected
	whyNot string
	// legacyUnheld: the pod's hand-written driver mounts are kept
	// (legacyMounts: Keep) and no layout has their host paths.
	legacyUnheld bool
}

// choose finds the layout for the pod: the one it was injected with while
// that fits, else the best that fits it as it would be without that pin.
func (r *request) choose(rt runtimeDecision) choice {
	keep := len(r.legacy) > 0 && r.cfg.LegacyMounts == config.LegacyMountsKeep
	ch := choice{legacyUnheld: keep && len(r.ranking(keep)) == 0}
	view := &r.asIs
	ch.layout, ch.whyNot = r.chooseLayout(view, r.prev, keep)
	if r.prev != nil && (ch.layout == nil || !injectionFits(r.prev, ch.layout)) {
		ch.stale = r.prev
		// Wedged nodes carry no fingerprint to match the pin either.
		view = r.unpinnedView()
		ch.layout, ch.whyNot = r.chooseLayout(view, nil, keep)
	}
	if r.cfg.DriverDelivery == config.DeliveryRuntime && ch.layout != nil && ch.layout.Static == "" {
		// Only the noLayout action's static layout may still carry hostPath.
		ch.layout, ch.whyNot = nil, rt.whyNot()
	}
	if ch.legacyUnheld {
		ch.whyNot = legacyKeptWhy(r.legacy)
	}
	if ch.layout == nil {
		if why := r.wedgedWhy(view.pod, &r.need); why != "" {
			ch.whyNot += "; " + why
		}
	}
	return ch
}

// unpinnedView is the pod as it would be without the fingerprint selector
// of its earlier injection, to choose a layout for it again.
func (r *request) unpinnedView() *podView {
	p := unpinned(r.view, r.prev)
	if p == r.view {
		return &r.asIs
	}
	return &podView{pod: p}
}
