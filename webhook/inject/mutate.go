package inject

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

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
// answer, and so that running it on its own output changes nothing. It
// decides first and edits after: a pod skipped or denied is left as it came.
func Mutate(in Input, cfg *config.Configuration) Result {
	return MutateContext(context.Background(), in, cfg)
}

// request is one call of Mutate: the pod and what the decision reads of it,
// the namespace's Pod Security level, the configuration and the candidate
// layouts, gathered once.
type request struct {
	// ctx is the caller's; nil offline.
	ctx context.Context
	cfg *config.Configuration
	// pod is the pod as it came; only apply changes it.
	pod *corev1.Pod
	// view is the pod as the decision reads it: with the resource fixes
	// made, on a copy, when it needs any; else pod itself.
	view *corev1.Pod
	// fixes are the edits of fixResources, made on view, and fixPatch their
	// operations, which hold for pod as they did for view; apply makes them
	// on pod. fixWarnings say what they do.
	fixes       []Edit
	fixPatch    []jsonpatch.Operation
	fixWarnings []string
	// renamed are the names fixResources renamed legacy resources to.
	renamed []corev1.ResourceName
	// podSecurity is the namespace's enforced Pod Security level.
	podSecurity string
	layouts     []*Layout
	wedged      []*WedgedNode
	seed        uint64
	// gpuResources and gpuClaims are Input.GPUResources and Input.GPUClaims.
	gpuResources []string
	gpuClaims    []string
	// images are Input.Images; unread is Input.ImagesUnread.
	images map[string]*ImageConfig
	unread []layout.ImageUnread
	// cuda is what the pod's GPU containers require of the driver.
	cuda cudaNeed
	// cudaOnlyTerm: the pod had no required node affinity, and view's
	// only term is the one planCUDA added.
	cudaOnlyTerm bool

	// exempt is why the pod is left alone before anything else of it is
	// read (its namespace is excluded, or it opted out), reasonNone if not.
	exempt reason
	// tooMany: more containers want a GPU than limits.maxGPUContainers.
	tooMany bool
	targets []containerRef
	// prev is the record of an earlier injection; prevErr why it cannot
	// be read.
	prev    *layout.Injected
	prevErr error
	// forged: the pod carried a runtime record it does not bear out, which
	// prev no longer holds.
	forged bool
	legacy []legacyMount
	need   gpuNeed
	// affinity is the pod's required node affinity, nil without one.
	affinity *nodeAffinity
	// asIs is the view for the layout choice, the fits of its layouts kept.
	asIs podView
	// ranked are the layouts in the policy's order, once sorted.
	ranked []rankedLayout
}

// newRequest gathers what the decision reads, stopping at the first fact
// that settles it: an exempt pod is not read further, nor is one without a
// GPU container or with a record it cannot read.
func newRequest(in Input, cfg *config.Configuration) request {
	r := request{
		cfg: cfg, pod: in.Pod, view: in.Pod,
		podSecurity: in.NamespaceLabels[labelPodSecurityEnforce],
		layouts:     in.Layouts, wedged: in.Wedged, seed: in.Seed,
		gpuResources: in.GPUResources, gpuClaims: in.GPUClaims, images: in.Images, unread: in.ImagesUnread,
	}
	if r.exempt = exemption(in.Pod, cfg); r.exempt != reasonNone {
		return r
	}
	if r.tooMany = r.tooManyGPUContainers(); r.tooMany {
		return r
	}
	r.planFixes()
	if r.targets = r.targetContainers(r.view); len(r.targets) == 0 {
		return r
	}
	r.planCUDA()
	if r.prev, r.prevErr = PreviousInjection(r.view); r.prevErr != nil {
		return r
	}
	r.distrustRecord()
	var recorded []string
	if r.prev != nil {
		recorded = r.prev.Volumes
	}
	r.legacy = r.legacyMounts(r.view, r.targets, r.layouts, recorded)
	r.need = r.requestedGPUResources(r.view)
	if r.cudaOnlyTerm {
		r.affinity = cudaAffinity(r.cuda.gt)
	} else {
		r.affinity = newNodeAffinity(r.view)
	}
	r.asIs = podView{pod: r.view}
	return r
}

// exemption is why a pod is left alone whatever it asks for: its namespace
// is excluded, it opted out, or the chart's admission policy admitted it
// (whose label the webhook's objectSelector leaves out, so that Mutate
// answers as the cluster does).
func exemption(pod *corev1.Pod, cfg *config.Configuration) reason {
	if slices.Contains(cfg.ExcludedNamespaces, pod.Namespace) {
		return reasonExcludedNamespace
	}
	if v, ok := pod.Annotations[layout.AnnotationInject]; ok && strings.EqualFold(v, "false") {
		return reasonOptOut
	}
	if pod.Labels[layout.LabelAdmission] == layout.AdmissionPolicy {
		return reasonAdmittedByPolicy
	}
	return reasonNone
}

// annotationWarnings name a value of the pod's opt-out annotation that is
// neither "false" nor "true": only "false" opts out, so a pod that says "no",
// "disabled" or "off" is injected all the same, and its author would not know.
func annotationWarnings(pod *corev1.Pod) []string {
	v, ok := pod.Annotations[layout.AnnotationInject]
	if !ok || strings.EqualFold(v, "false") || strings.EqualFold(v, "true") {
		return nil
	}
	return []string{WarnPrefix + fmt.Sprintf(`the pod's annotation %s=%q is neither "false" nor "true", and is ignored: only %s: "false" opts the pod out`,
		layout.AnnotationInject, truncate(v, 80), layout.AnnotationInject)}
}

// isGPU reports whether a resource name is a configured GPU resource, or one
// that a GPU DeviceClass serves.
func (r *request) isGPU(name corev1.ResourceName) bool {
	return slices.Contains(r.gpuResources, string(name)) || r.cfg.IsGPUResource(string(name))
}

func (r *request) wantsGPU(c *corev1.Container) bool {
	for _, rc := range c.Resources.Claims {
		if slices.Contains(r.gpuClaims, rc.Name) {
			return true
		}
	}
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name, q := range rl {
			if r.isGPU(name) && !q.IsZero() {
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

// planFixes makes fixResources' edits on a copy of the pod, which the
// decision reads: a legacy resource's pod asks for the new name, with the
// toleration that comes with it. The pod itself is changed only by apply.
func (r *request) planFixes() {
	if !r.needsFixes(r.pod) {
		return
	}
	c := &change{editor: editor{pod: r.pod.DeepCopy()}}
	r.renamed = r.fixResources(c)
	if c.changed() {
		r.view, r.fixes, r.fixPatch, r.fixWarnings = c.pod, c.edits, c.patch, c.warnings
	}
}

// needsFixes reports whether fixResources would change the pod: it names a
// legacy GPU resource, or requests a GPU resource without a limit.
func (r *request) needsFixes(pod *corev1.Pod) bool {
	for _, cs := range [...][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			res := &cs[i].Resources
			for _, legacy := range r.cfg.Resources.Legacy {
				_, inLimits := res.Limits[corev1.ResourceName(legacy)]
				_, inRequests := res.Requests[corev1.ResourceName(legacy)]
				if inLimits || inRequests {
					return true
				}
			}
			for name := range res.Requests {
				if _, ok := res.Limits[name]; !ok && r.isGPU(name) {
					return true
				}
			}
		}
	}
	return false
}

// fixResources renames legacy GPU resources and copies request-only GPU
// resources to limits, which the API server would otherwise reject. A pod
// renamed gets the toleration the ExtendedResourceToleration admission plugin
// would have given it for the new name (resources.renameToleration). It
// returns the names it renamed resources to.
func (r *request) fixResources(ch *change) []corev1.ResourceName {
	var renamedTo []corev1.ResourceName
	to := corev1.ResourceName(r.cfg.Resources.RenameTo)
	tolerate := r.cfg.Resources.RenameToleration == config.RenameTolerationAdd && config.IsExtendedResourceName(string(to))
	for _, ref := range containerRefs(ch.pod) {
		c := ref.get(ch.pod)
		for _, legacy := range r.cfg.Resources.Legacy {
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
					ch.warn("container %q sets both %s=%s and %s=%s; kept %s=%s", c.Name, from, q.String(), to, have.String(), to, have.String())
				}
				ch.do(renameResource{container: ref, list: list, from: from, to: to, quantity: q, keep: keep})
				renamed = true
			}
			if renamed {
				if !slices.Contains(renamedTo, to) {
					renamedTo = append(renamedTo, to)
				}
				tolerated := ""
				if tolerate && !toleratesResource(ch.pod.Spec.Tolerations, to) {
					t := resourceToleration(to)
					ch.do(addToleration{toleration: t})
					tolerated = fmt.Sprintf("; added the toleration %s that the ExtendedResourceToleration admission plugin gives pods requesting %s (it gives none for the legacy name), so the pod may use nodes tainted %s:%s", describeToleration(t), to, to, t.Effect)
				}
				ch.warn("container %q: resource %s renamed to %s (no node offers the legacy name, so the pod would stay Pending forever)%s", c.Name, from, to, tolerated)
				// Extended resources need request == limit; a rename that met
				// an existing, different value must not break that.
				lim, hasLim := c.Resources.Limits[to]
				if req, ok := c.Resources.Requests[to]; ok && hasLim && req.Cmp(lim) != 0 {
					ch.do(setResource{container: ref, list: requests, name: to, quantity: lim})
					ch.warn("container %q: request %s=%s set to its limit %s", c.Name, to, req.String(), lim.String())
				}
			}
		}
		for _, name := range sortedResourceNames(c.Resources.Requests) {
			q := c.Resources.Requests[name]
			if !r.isGPU(name) {
				continue
			}
			if _, ok := c.Resources.Limits[name]; ok {
				continue
			}
			ch.do(setResource{container: ref, list: limits, name: name, quantity: q})
			ch.warn("container %q requests %s=%s without a limit; copied it to limits (GPUs cannot be overcommitted, so the API server requires a limit)", c.Name, name, q.String())
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

// targetContainers are the containers that get the driver: those that
// want a GPU, or with containers: All every container of a pod that has one.
func (r *request) targetContainers(pod *corev1.Pod) []containerRef {
	var gpu []containerRef
	all := containerRefs(pod)
	for _, ref := range all {
		if r.wantsGPU(ref.get(pod)) {
			gpu = append(gpu, ref)
		}
	}
	if len(gpu) == 0 || r.cfg.Containers != config.ContainersAll {
		return gpu
	}
	return all
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
