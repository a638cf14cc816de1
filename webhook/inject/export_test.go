package inject

import (
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
)

// The internals the package's external tests (package inject_test, which
// build their candidates through the node index) drive directly.

const EnvLDLibraryPath = envLDLibraryPath

// WedgedWhy is wedgedWhy for a pod that renames and requests nothing.
func WedgedWhy(pod *corev1.Pod, wedged []*WedgedNode) string {
	r := &request{wedged: wedged, affinity: newNodeAffinity(pod)}
	return r.wedgedWhy(pod, nil)
}

// RemoveLibraryDirs removes dirs (but keep) from the LD_LIBRARY_PATH of the
// pod's app container i and returns the patch.
func RemoveLibraryDirs(pod *corev1.Pod, i int, dirs, keep []string) []jsonpatch.Operation {
	ed := &editor{pod: pod}
	removeLibraryDirs(ed, containerRef{appContainers, i}, dirs, keep)
	return ed.patch
}

// LegacyMounts counts the pod's hand-written driver mounts; recorded are the
// volumes an earlier injection's record lists.
func LegacyMounts(cfg *config.Configuration, pod *corev1.Pod, layouts []*Layout, recorded []string) int {
	r := &request{cfg: cfg}
	return len(r.legacyMounts(pod, containerRefs(pod), layouts, recorded))
}

// Decide is the decision Mutate would carry out on in, by name: its
// outcome, reason and delivery.
func Decide(in Input, cfg *config.Configuration) (outcome, reason, delivery string) {
	r := newRequest(in, cfg)
	d := r.decide()
	return d.outcome.String(), d.reason.String(), d.delivery.String()
}

// CUDAAffinityMatches matches a node with the shortcut planCUDA takes for a
// pod that had no required affinity (fast), and with the node selector the
// steered pod's affinity makes (general).
func CUDAAffinityMatches(gt int, n *NodeInfo) (fast, general bool) {
	pod := &corev1.Pod{}
	requireNodeExpression{expr: cudaExpression(gt)}.apply(pod)
	return cudaAffinity(gt).matches(n), newNodeAffinity(pod).matches(n)
}

// ContainerCUDANeed is the container's CUDA need as admission reads it
// (fast: its image's parsed once where its env names no requirement
// variable) and as its whole environment says (slow).
func ContainerCUDANeed(c *corev1.Container, img *ImageConfig) (fast, slow int, fastValue, slowValue string) {
	fast, fastValue = containerCUDANeed(c, img)
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	slow, slowValue = envCUDANeed(append(env, img.Env...))
	return fast, slow, fastValue, slowValue
}
