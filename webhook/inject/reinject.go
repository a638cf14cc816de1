package inject

import (
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// PreviousInjection reads the record of an earlier injection; nil when the
// pod carries none. The record decides what a re-injection removes, so one
// that names a volume gpu-injector would never make is refused rather than
// trusted with the user's volumes.
func PreviousInjection(pod *corev1.Pod) (*layout.Injected, error) {
	v, ok := pod.Annotations[layout.AnnotationInjected]
	if !ok {
		return nil, nil
	}
	inj, err := layout.ParseInjected(v)
	if err != nil {
		return nil, err
	}
	for _, name := range inj.Volumes {
		if !strings.HasPrefix(name, volumePrefix) {
			return nil, fmt.Errorf("failed to read the injection record: volume %q is no name gpu-injector gives (%s...)", layout.Truncate(name, 64), volumePrefix)
		}
	}
	return &inj, nil
}

// injectionFits reports whether an earlier injection is still what layout l
// (which chooseLayout found for it) would inject. A probed layout is its
// fingerprint's; a static one may have changed in the configuration under
// the same name.
func injectionFits(prev *layout.Injected, l *Layout) bool {
	if l.Static == "" {
		return true
	}
	if prev.DriverVersion != l.Plan.DriverVersion {
		return false
	}
	for _, v := range prev.Volumes {
		if !slices.ContainsFunc(l.Plan.Mounts, func(mt layout.Mount) bool {
			n := volumeName(mt)
			return v == n || strings.HasPrefix(v, n+"-")
		}) {
			return false
		}
	}
	return true
}

// unpinned is the pod as it would be without the fingerprint selector of its
// earlier injection, to choose a layout for it again. A shallow copy: the
// choice only reads the pod.
func unpinned(pod *corev1.Pod, prev *layout.Injected) *corev1.Pod {
	if prev.Fingerprint == "" || pod.Spec.NodeSelector[layout.LabelFingerprint] != prev.Fingerprint {
		return pod
	}
	p := *pod
	p.Spec.NodeSelector = make(map[string]string, len(pod.Spec.NodeSelector))
	for k, v := range pod.Spec.NodeSelector {
		if k != layout.LabelFingerprint {
			p.Spec.NodeSelector[k] = v
		}
	}
	return &p
}

// describeInjected names an earlier injection's driver and layout.
func describeInjected(prev *layout.Injected) string {
	if prev.StaticLayout != "" {
		return fmt.Sprintf("%s of static layout %s", prev.DriverVersion, prev.StaticLayout)
	}
	if prev.Pool != "" {
		return fmt.Sprintf("%s of layout %s of %s", prev.DriverVersion, prev.Fingerprint, describePools(prev.Pool))
	}
	return fmt.Sprintf("%s of layout %s", prev.DriverVersion, prev.Fingerprint)
}

// describeLayout names a layout a pod is injected with.
func describeLayout(l *Layout) string {
	switch {
	case l.Static != "":
		return "static layout " + l.Static
	case l.Pool != "":
		return "layout " + l.Fingerprint + " of " + describePools(l.Pool)
	}
	return "layout " + l.Fingerprint
}

// staleWhy says why an earlier injection no longer fits.
func (r *request) staleWhy(prev *layout.Injected) string {
	if prev.StaticLayout != "" {
		if _, ok := r.cfg.Static(prev.StaticLayout); !ok {
			return "which is no longer in the configuration"
		}
		return "which changed in the configuration"
	}
	return "which no ready node the pod may use publishes now"
}

// removeInjection takes out what an earlier injection put in, as its record
// names it: the hostPath volumes it lists (of gpu-injector's names) and every
// mount of them, the folders those mounts put on LD_LIBRARY_PATH, the
// fingerprint selector and the pool marker label. What the next layout would
// put back the same stays, so that a driver upgrade that keeps its paths
// changes only the record: a volume of the same host path at the same place in
// a target container, a folder the next layout also puts on LD_LIBRARY_PATH,
// the same pin. The node selector of a pool or a static layout, and the node
// affinity over the pools of one layout, stay: they name labels the user may
// have written too, and keep the pod in its pools, so the next layout is one
// of those pools' and its pin, ANDed in, narrows the old one.
// Nothing else of the pod is touched. next is nil when nothing comes in.
func (r *request) removeInjection(c *change, prev *layout.Injected, next *Layout) {
	pod := c.pod
	old := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && slices.Contains(prev.Volumes, v.Name) {
			old[v.Name] = v
		}
	}
	// keep: volume name -> container path, of the next layout's same mounts.
	keep := map[string]string{}
	var libs []string
	if next != nil {
		for _, pm := range next.preparedMounts() {
			if v, ok := old[pm.volume.Name]; ok && apiequalHostPath(v, pm.volume) {
				keep[pm.volume.Name] = pm.mount.ContainerPath
			}
		}
		libs = next.Plan.LibraryPaths
	}

	refs := containerRefs(pod)
	for i := range pod.Spec.EphemeralContainers {
		refs = append(refs, containerRef{ephemeralContainers, i})
	}
	for _, ref := range refs {
		ctr := ref.get(pod)
		var dirs []string
		for _, vm := range ctr.VolumeMounts {
			v, ok := old[vm.Name]
			if !ok || !path.IsAbs(vm.MountPath) {
				continue
			}
			d := path.Clean(vm.MountPath)
			if t := v.HostPath.Type; t != nil && *t == corev1.HostPathFile {
				d = path.Dir(d)
			}
			dirs = append(dirs, d)
		}
		target := slices.Contains(r.targets, ref)
		for i := len(ctr.VolumeMounts) - 1; i >= 0; i-- {
			vm := ctr.VolumeMounts[i]
			if _, ok := old[vm.Name]; !ok {
				continue
			}
			if cp, ok := keep[vm.Name]; ok && target && vm.MountPath == cp {
				continue
			}
			c.do(removeMount{container: ref, index: i})
		}
		if len(dirs) > 0 && r.cfg.LDLibraryPath != config.LDLibraryPathOff {
			removeLibraryDirs(&c.editor, ref, dirs, libs)
		}
	}
	for i := len(pod.Spec.Volumes) - 1; i >= 0; i-- {
		name := pod.Spec.Volumes[i].Name
		if _, recorded := old[name]; !recorded {
			continue
		}
		if _, kept := keep[name]; kept {
			continue
		}
		c.do(removeVolume{index: i})
	}

	if fp := prev.Fingerprint; fp != "" {
		samePin := next != nil && next.Static == "" && next.Pool == "" && next.Fingerprint == fp
		if pod.Spec.NodeSelector[layout.LabelFingerprint] == fp && !samePin {
			c.do(removeNodeSelector{key: layout.LabelFingerprint})
		}
		// The next pool's marker replaces it; without a pool the marker would
		// have the elected replica report a mismatch that is none.
		if pod.Labels[layout.LabelPinnedLayout] == fp && (next == nil || next.Pool == "") {
			c.do(removeLabel{key: layout.LabelPinnedLayout})
		}
	}
}

// removeLibraryDirs takes the folders an earlier injection's mounts put on
// the container's LD_LIBRARY_PATH (a folder mounted, a file's folder, or a
// folder below a mounted one) out of it, but for those in keep; the variable
// goes when nothing else is left in it.
func removeLibraryDirs(ed *editor, ref containerRef, dirs, keep []string) {
	c := ref.get(ed.pod)
	idx := -1
	for i, e := range c.Env {
		if e.Name == envLDLibraryPath {
			idx = i
		}
	}
	if idx < 0 || c.Env[idx].ValueFrom != nil {
		return
	}
	old := c.Env[idx].Value
	var rest []string
	for _, el := range strings.Split(old, ":") {
		injected := slices.ContainsFunc(dirs, func(d string) bool { return el == d || strings.HasPrefix(el, d+"/") })
		if injected && !slices.Contains(keep, el) {
			continue
		}
		rest = append(rest, el)
	}
	switch value := strings.Join(rest, ":"); value {
	case old:
	case "", "$(" + envLDLibraryPath + ")":
		ed.do(removeEnv{container: ref, index: idx})
	default:
		ed.do(setEnvValue{container: ref, index: idx, value: value})
	}
}
