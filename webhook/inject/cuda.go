package inject

import (
	"fmt"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/cudareq"
	"github.com/gpu-injector/gpu-injector/layout"
)

// cudaNeed is the CUDA version a pod's GPU containers require of the
// node's driver, as a nodeAffinity Gt threshold on
// layout.LabelCUDADriverVersionNumber: the nodes above gt can run it.
type cudaNeed struct {
	// gt is 0 when nothing is required, or nothing the label can steer.
	gt int
	// value is the requirement as written: the pod's annotation, or the
	// NVIDIA_REQUIRE_CUDA of the container's image (its own env over the
	// image's ENV). The words of what() are built only when a message
	// needs them.
	value, container, image string
	// fromAnnotation: the pod's annotation set it (or turned it off).
	fromAnnotation bool
}

// what says who requires it: the container and its image's variable, or
// the pod's annotation.
func (n cudaNeed) what() string {
	if n.fromAnnotation {
		return fmt.Sprintf("the pod's annotation %s=%q", layout.AnnotationCUDARequirement, n.value)
	}
	return fmt.Sprintf("container %q: its image %s has %s=%q", n.container, n.image, cudareq.EnvRequireCUDA, truncate(n.value, 120))
}

// cudaAnnotationNone turns steering off for a pod.
const cudaAnnotationNone = "none"

// cudaNeedOf reads what the pod's GPU containers require: the pod's
// annotation when it has one, else each container's
// NVIDIA_REQUIRE_CUDA, from its own env over its image's ENV, none where
// NVIDIA_DISABLE_REQUIRE is true. Only an image whose registry answered
// says anything; the largest need wins. Warnings say what was ignored.
func (r *request) cudaNeedOf(pod *corev1.Pod) (need cudaNeed, warnings []string) {
	if v, ok := pod.Annotations[layout.AnnotationCUDARequirement]; ok {
		if strings.TrimSpace(v) == cudaAnnotationNone {
			return cudaNeed{fromAnnotation: true}, nil
		}
		if gt, ok := steerable(v); ok {
			return cudaNeed{gt: gt, value: v, fromAnnotation: true}, nil
		}
		warnings = append(warnings, fmt.Sprintf("the pod's annotation %s=%q is neither %q nor a requirement of the form cuda>=X.Y; the images' requirements are used", layout.AnnotationCUDARequirement, truncate(v, 80), cudaAnnotationNone))
	}
	return r.imagesCUDANeed(pod), warnings
}

// imagesCUDANeed is the largest NVIDIA_REQUIRE_CUDA of the pod's GPU
// containers whose image's registry answered.
func (r *request) imagesCUDANeed(pod *corev1.Pod) cudaNeed {
	var need cudaNeed
	if len(r.images) == 0 {
		return need
	}
	for _, ref := range containerRefs(pod) {
		c := ref.get(pod)
		img := r.images[c.Image]
		if img == nil || !r.wantsGPU(c) {
			continue
		}
		if gt, value := containerCUDANeed(c, img); gt > need.gt {
			need = cudaNeed{gt: gt, value: value, container: c.Name, image: c.Image}
		}
	}
	return need
}

// containerCUDANeed is the Gt threshold of the container's
// NVIDIA_REQUIRE_CUDA and its value, 0 when it requires nothing steerable.
// A container whose env names neither variable has its image's need,
// parsed once per image.
func containerCUDANeed(c *corev1.Container, img *ImageConfig) (int, string) {
	if !setsCUDARequirement(c.Env) {
		n := img.cudaNeed()
		return n.gt, n.value
	}
	env := make([]string, 0, len(c.Env)+len(img.Env))
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	// The first of a name counts: the container's own value over its image's.
	return envCUDANeed(append(env, img.Env...))
}

// setsCUDARequirement reports whether env names a variable that decides
// the CUDA need: a value from a reference counts as unset, as the webhook
// cannot read it.
func setsCUDARequirement(env []corev1.EnvVar) bool {
	for _, e := range env {
		if e.ValueFrom == nil && (e.Name == cudareq.EnvRequireCUDA || e.Name == cudareq.EnvDisable) {
			return true
		}
	}
	return false
}

// envCUDANeed is the Gt threshold of an environment's NVIDIA_REQUIRE_CUDA
// and its value, 0 when NVIDIA_DISABLE_REQUIRE turns it off or it is not
// steerable.
func envCUDANeed(env []string) (int, string) {
	// Past cudareq.MaxVars nothing steers the pod; the NRI plugin refuses
	// such a container.
	vars, _, _ := cudareq.FromEnv(env)
	for _, v := range vars {
		if v.Name != cudareq.EnvRequireCUDA {
			continue
		}
		if gt, ok := steerable(v.Value); ok {
			return gt, v.Value
		}
	}
	return 0, ""
}

// steerable is the Gt threshold of a requirement whose first alternative is
// cuda>=X (what CUDA images write first).
func steerable(req string) (int, bool) {
	parsed, err := cudareq.Parse(req)
	if err != nil {
		return 0, false
	}
	gt, ok := parsed.AffinityGt()
	return gt, ok && gt > 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// cudaVersionOf writes a label number (12040) as a version (12.4).
func cudaVersionOf(n int) string {
	return fmt.Sprintf("%d.%d", n/1000, n%1000/10)
}

// cudaAbove is the oldest CUDA version above a Gt threshold, as a driver
// reports it (major.minor).
func cudaAbove(gt int) string {
	return cudaVersionOf(gt + 1)
}

// planCUDA adds to the view the required node-affinity expression that
// keeps the pod off nodes whose driver cannot run what it requires, as a
// fix that apply makes on the pod, unless every term already has it.
func (r *request) planCUDA() {
	need, warnings := r.cudaNeedOf(r.view)
	r.cuda = need
	for _, w := range warnings {
		r.fixWarnings = append(r.fixWarnings, WarnPrefix+w)
	}
	if need.gt == 0 || cudaPinned(r.view, need.gt) {
		return
	}
	view := r.view
	if view == r.pod {
		// Only the affinity is edited: the rest of the pod is shared, read only.
		cp := *r.pod
		cp.Spec.Affinity = r.pod.Spec.Affinity.DeepCopy()
		view = &cp
	}
	r.cudaOnlyTerm = !hasRequiredAffinity(view)
	c := &change{editor: editor{pod: view, edits: r.fixes, patch: r.fixPatch}, warnings: r.fixWarnings}
	c.do(requireNodeExpression{expr: cudaExpression(need.gt)})
	c.warn("%s: required node affinity %s Gt %d added, so the pod runs only where the driver supports CUDA %s or newer", need.what(), layout.LabelCUDADriverVersionNumber, need.gt, cudaAbove(need.gt))
	r.view, r.fixes, r.fixPatch, r.fixWarnings = c.pod, c.edits, c.patch, c.warnings
}

func cudaExpression(gt int) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: layout.LabelCUDADriverVersionNumber, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(gt)}}
}

// cudaPinned reports whether every required term already keeps the pod
// above gt: a second run, or a user who wrote it.
func cudaPinned(pod *corev1.Pod, gt int) bool {
	terms := requiredTerms(pod)
	if len(terms) == 0 {
		return false
	}
	for _, t := range terms {
		pinned := false
		for _, e := range t.MatchExpressions {
			if e.Key == layout.LabelCUDADriverVersionNumber && e.Operator == corev1.NodeSelectorOpGt && len(e.Values) == 1 {
				if v, err := strconv.Atoi(e.Values[0]); err == nil && v >= gt {
					pinned = true
				}
			}
		}
		if !pinned {
			return false
		}
	}
	return true
}

// hasRequiredAffinity reports whether the pod has a required node
// affinity, even one of no terms (which matches no node).
func hasRequiredAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	return a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil
}

func requiredTerms(pod *corev1.Pod) []corev1.NodeSelectorTerm {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
}

// cudaUnserved reports whether the pod is to be denied for its CUDA need:
// no node can run it, and noLayout says to deny. Under driverDelivery:
// Runtime no node is read, so every pool counts as declared: the pin keeps
// the pod Pending until a node that can run it joins.
func (r *request) cudaUnserved() bool {
	return r.cuda.gt > 0 && r.cfg.NoLayout.Action == config.NoLayoutDeny &&
		r.cfg.DriverDelivery != config.DeliveryRuntime && !r.cudaServed()
}

// cudaServed reports whether some node of the candidate layouts (a ready
// node, or the node that stands for a remembered pool) has a driver above
// the pod's need.
func (r *request) cudaServed() bool {
	for _, l := range r.layouts {
		for _, n := range l.Nodes {
			if v, ok := n.Labels.Lookup(layout.LabelCUDADriverVersionNumber); ok {
				if got, err := strconv.Atoi(v); err == nil && got > r.cuda.gt {
					return true
				}
			}
		}
	}
	return false
}

// newestCUDA names the newest driver of the candidate layouts' nodes.
func (r *request) newestCUDA() string {
	best, driver := 0, ""
	for _, l := range r.layouts {
		for _, n := range l.Nodes {
			v, ok := n.Labels.Lookup(layout.LabelCUDADriverVersionNumber)
			if got, err := strconv.Atoi(v); ok && err == nil && got > best {
				best, driver = got, l.Plan.DriverVersion
			}
		}
	}
	if best == 0 {
		return "no ready GPU node publishes its CUDA version"
	}
	return fmt.Sprintf("the newest driver of the cluster's GPU nodes is %s (CUDA %s)", driver, cudaVersionOf(best))
}

// cudaDenial says why no node can run the pod, and how to override.
func (r *request) cudaDenial() string {
	return fmt.Sprintf("%s, which needs a driver supporting CUDA %s or newer; %s. Run it where a newer driver is installed, or, if the pod needs less than its image says, set the annotation %s to what it needs (cuda>=X.Y), or to %q to not steer it",
		r.cuda.what(), cudaAbove(r.cuda.gt), r.newestCUDA(), layout.AnnotationCUDARequirement, cudaAnnotationNone)
}

// requireNodeExpression adds a match expression to every required
// node-affinity term (terms are ORed, so each must hold it), or makes the
// one term when the pod has none.
type requireNodeExpression struct {
	expr corev1.NodeSelectorRequirement
}

func (e requireNodeExpression) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	const base = "/spec/affinity"
	// The API's own types, which encode as the maps would, in fewer
	// allocations; the patch's values are its own, never the pod's.
	term := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{e.expr}}}
	a := pod.Spec.Affinity
	switch {
	case a == nil:
		return append(out, jsonpatch.Operation{Operation: "add", Path: base, Value: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: term}}}})
	case a.NodeAffinity == nil:
		return append(out, jsonpatch.Operation{Operation: "add", Path: base + "/nodeAffinity", Value: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: term}}})
	case a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil:
		return append(out, jsonpatch.Operation{Operation: "add", Path: base + "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", Value: &corev1.NodeSelector{NodeSelectorTerms: term}})
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	p := base + "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
	if len(terms) == 0 {
		return append(out, jsonpatch.Operation{Operation: "add", Path: p, Value: term})
	}
	for i, t := range terms {
		out = append(out, appendOp(p+"/"+strconv.Itoa(i)+"/matchExpressions", len(t.MatchExpressions), e.expr))
	}
	return out
}

func (e requireNodeExpression) apply(pod *corev1.Pod) {
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	a := pod.Spec.Affinity
	if a.NodeAffinity == nil {
		a.NodeAffinity = &corev1.NodeAffinity{}
	}
	if a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if len(req.NodeSelectorTerms) == 0 {
		req.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range req.NodeSelectorTerms {
		t := &req.NodeSelectorTerms[i]
		t.MatchExpressions = append(t.MatchExpressions, e.expr)
	}
}
