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
