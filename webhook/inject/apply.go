package inject

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// change is the edits apply makes on a pod, and the warnings that tell the
// user about them.
type change struct {
	editor
	warnings []string
}

func (c *change) warn(format string, args ...any) {
	c.warnings = append(c.warnings, WarnPrefix+fmt.Sprintf(format, args...))
}

// apply carries the decision out and says what was done. Only a pod admitted
// or injected is changed: the resource fixes first, then what takes out an
// earlier injection or a foreign marker, then the driver.
func (r *request) apply(d decision) Result {
	switch d.outcome {
	case outcomeDeny:
		return Result{Decision: DecisionDenied, Reason: WarnPrefix + r.denial(d), Warnings: d.warnings}
	case outcomeSkip:
		return Result{Decision: DecisionSkipped, Reason: d.reason.String(), Warnings: d.warnings}
	}
	c := &change{editor: editor{pod: r.pod, edits: r.fixes, patch: r.fixPatch}, warnings: r.fixWarnings}
	for _, e := range r.fixes {
		e.apply(r.pod)
	}
	if d.dropMarker {
		c.do(removeAnnotation{key: layout.AnnotationRuntimeInject})
		c.warn("the pod's annotation %s was removed: only gpu-injector writes it, on pods whose driver the node's NRI plugin mounts (%s)", layout.AnnotationRuntimeInject, d.runtime.whyNot())
	}
	if d.dropRecord {
		c.do(removeAnnotation{key: layout.AnnotationInjected})
		c.warn("the pod's annotation %s was removed: it records a runtime injection that the pod's marker, containers and NRI required-plugins annotation do not bear out, and only gpu-injector writes it", layout.AnnotationInjected)
	}
	c.warnings = append(c.warnings, d.warnings...)
	switch {
	case d.outcome == outcomeAdmit:
		r.takeOutStale(c, d)
	case d.delivery == deliveryNRI:
		r.injectRuntime(c, d.runtime)
	default:
		r.injectLayout(c, d)
	}
	if d.outcome == outcomeInject {
		r.recordImagesUnread(c)
	}
	res := Result{Edits: c.edits, Patch: c.patch, Decision: DecisionSkipped, Reason: d.reason.String(), Warnings: c.warnings}
	if c.changed() {
		res.Decision = DecisionInjected
	}
	if d.outcome == outcomeInject {
		res.Layout, res.Reason = d.layout, ""
		if !c.changed() {
			res.Reason = ReasonAlreadyInjected
		}
	}
	return res
}

// recordImagesUnread writes on the pod the images admitted without their
// configuration, or takes out a record of them that this admission does
// not bear out: an earlier admission's, or one the pod's author wrote.
func (r *request) recordImagesUnread(c *change) {
	_, hasLabel := c.pod.Labels[layout.LabelImagesUnread]
	have, hasRecord := c.pod.Annotations[layout.AnnotationImagesUnread]
	if len(r.unread) == 0 {
		if hasRecord {
			c.do(removeAnnotation{key: layout.AnnotationImagesUnread})
		}
		if hasLabel {
			c.do(removeLabel{key: layout.LabelImagesUnread})
		}
		if hasRecord || hasLabel {
			c.warn("the pod's annotation and label %s were removed: only gpu-injector writes them, on a pod admitted without the configuration of an image it tried to read, and this admission missed none", layout.AnnotationImagesUnread)
		}
		return
	}
	if want := layout.NewImagesUnread(r.unread).String(); have != want {
		c.do(setAnnotation{key: layout.AnnotationImagesUnread, value: want})
	}
	if c.pod.Labels[layout.LabelImagesUnread] != layout.LabelImagesUnreadValue {
		c.do(setLabel{key: layout.LabelImagesUnread, value: layout.LabelImagesUnreadValue})
	}
}

// takeOutStale takes out of a pod admitted without the driver the earlier
// injection its layout's nodes now make needless (runtimeInjection: Skip):
// the pod is left as one never injected, without the driver, its pin and
// its record.
func (r *request) takeOutStale(c *change, d decision) {
	s := d.stale
	if s == nil {
		return
	}
	r.removeInjection(c, s, nil)
	c.do(removeAnnotation{key: layout.AnnotationInjected})
	c.warn("the pod carried the NVIDIA driver %s, %s; removed, as %s injects driver %s there (runtimeInjection: %s)",
		describeInjected(s), r.staleWhy(s), injectedBy(d.layout.Plan.RuntimeInjection), d.layout.Plan.DriverVersion, config.RuntimeInjectionSkip)
}

// injectLayout gives the pod the chosen layout, in place of a stale
// injection and of hand-written driver mounts.
func (r *request) injectLayout(c *change, d decision) {
	l := d.layout
	if s := d.stale; s != nil {
		r.removeInjection(c, s, l)
		c.warn("the pod carried the NVIDIA driver %s, %s; re-injected with driver %s of %s: the volumes, mounts, %s folders and pin gpu-injector had put in follow the new layout, the rest of the pod is as it was",
			describeInjected(s), r.staleWhy(s), l.Plan.DriverVersion, describeLayout(l), envLDLibraryPath)
	}
	if len(r.legacy) > 0 && r.cfg.LegacyMounts == config.LegacyMountsReplace {
		replaceLegacy(c, r.legacy, l)
	}
	if r.prev == nil || d.stale != nil {
		poolWarnings(c, l)
	}
	r.inject(c, l)
}

// poolWarnings tells the user how a pod is pinned when that is not what an
// autoscaler can act on, or when a pool at zero was served from memory.
func poolWarnings(c *change, l *Layout) {
	if rm := l.Remembered; rm != nil {
		has := "has"
		if len(l.PoolLabels) > 1 {
			has = "have"
		}
		if rm.LastSeen.IsZero() {
			c.warn("%s %s no ready node; injected the layout pinning.pools declares for it (driver %s), so that the autoscaler can add a node for this pod",
				describePools(l.Pool), has, l.Plan.DriverVersion)
			return
		}
		declared := ""
		if len(rm.Declared) > 0 {
			declared = fmt.Sprintf("; pinning.pools declares %s", strings.Join(rm.Declared, " and "))
		}
		c.warn("%s %s no ready node; injected the layout its nodes published last (driver %s, last seen %s, remembered until %s%s), so that the autoscaler can add a node for this pod",
			describePools(l.Pool), has, l.Plan.DriverVersion, rm.LastSeen.UTC().Format(time.RFC3339), rm.Until.UTC().Format(time.RFC3339), declared)
		return
	}
	if l.Pool == "" && len(l.MixedPools) > 0 {
		c.warn("pool %s has ready nodes of more than one driver layout (an upgrade under way?): pinned by layout fingerprint, which no autoscaler can create a node for; the pod waits for a node of layout %s with room",
			strings.Join(l.MixedPools, " and "), l.Fingerprint)
	}
}

// volumeName is stable for a mount, so a second run finds its own volumes;
// 96 bits, so that a node cannot pick paths whose names collide.
func volumeName(mt layout.Mount) string {
	sum := sha256.Sum256([]byte(mt.HostPath + "\x00" + mt.ContainerPath))
	return volumePrefix + hex.EncodeToString(sum[:12])
}

// inject mounts the layout's volumes into the target containers, read-only,
// adds its library folders to their LD_LIBRARY_PATH, pins the pod to the
// layout's nodes and records what it injected.
func (r *request) inject(c *change, l *Layout) {
	pod := c.pod
	volumes := make(map[string]int, len(pod.Spec.Volumes))
	for i, v := range pod.Spec.Volumes {
		volumes[v.Name] = i
	}
	mounts := freeVolumeNames(pod, volumes, l.preparedMounts())
	// Room for every edit of a pod that has none of the layout's mounts yet.
	pod.Spec.Volumes = slices.Grow(pod.Spec.Volumes, len(mounts))
	n := (len(r.targets)+1)*(len(mounts)+1) + 3
	c.patch, c.edits = slices.Grow(c.patch, n), slices.Grow(c.edits, n)
	used, containers := r.mountInto(c, mounts, l.Plan.LibraryPaths)

	var injected []string
	for i := range mounts {
		v := &mounts[i].volume
		if !used[v.Name] {
			continue
		}
		injected = append(injected, v.Name)
		if _, ok := volumes[v.Name]; ok {
			continue
		}
		c.do(addVolume{volume: v, prepared: mounts[i].volumeJSON})
		volumes[v.Name] = len(pod.Spec.Volumes) - 1
	}
	forceReadOnly(c, injected)
	pinToLayout(c, l)

	record := layout.Injected{
		Fingerprint:   l.Fingerprint,
		StaticLayout:  l.Static,
		DriverVersion: l.Plan.DriverVersion,
		Containers:    containers,
		Volumes:       injected,
		Pool:          l.Pool,
		Remembered:    l.Remembered != nil,
	}.String()
	if pod.Annotations[layout.AnnotationInjected] != record {
		c.do(setAnnotation{key: layout.AnnotationInjected, value: record})
	}
}

// freeVolumeNames are the layout's prepared mounts, each renamed where a
// volume of the pod (volumes: name to index) holds its name by chance and is
// not the same hostPath.
func freeVolumeNames(pod *corev1.Pod, volumes map[string]int, mounts []preparedMount) []preparedMount {
	names := make([]string, 0, len(mounts))
	cloned := false
	for i := range mounts {
		want := mounts[i].volume
		name := want.Name
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
				mounts, cloned = slices.Clone(mounts), true
			}
			pm := &mounts[i]
			pm.volume.Name, pm.use = name, readOnlyUse(name, pm.mount.ContainerPath)
			pm.volumeJSON, pm.useJSON = nil, nil
		}
		names = append(names, name)
	}
	return mounts
}

// mountInto mounts the volumes into each target container where a mount of
// the user's does not already hold the path, and merges libs into its
// LD_LIBRARY_PATH. It returns the volumes some container mounts and the
// target containers' names.
func (r *request) mountInto(c *change, mounts []preparedMount, libs []string) (map[string]bool, []string) {
	pod := c.pod
	names := make([]string, len(mounts))
	for i := range mounts {
		names[i] = mounts[i].volume.Name
	}
	used := make(map[string]bool, len(mounts))
	containers := make([]string, 0, len(r.targets))
	for _, ref := range r.targets {
		ctr := ref.get(pod)
		ctr.VolumeMounts = slices.Grow(ctr.VolumeMounts, len(mounts))
		containers = append(containers, ctr.Name)
		list := ref.path() + "/volumeMounts"
		for i := range mounts {
			mt, name := mounts[i].mount, mounts[i].volume.Name
			if hasMount(ctr, name, mt.ContainerPath) {
				used[name] = true
				continue
			}
			if other := shadowingMount(ctr, mt.ContainerPath, names); other != nil {
				if other.MountPath == mt.ContainerPath {
					c.warn("container %q already mounts %s (volume %q); left as is, not mounted twice", ctr.Name, other.MountPath, other.Name)
				} else {
					c.warn("container %q already mounts %s (volume %q); %s not mounted inside it", ctr.Name, other.MountPath, other.Name, mt.ContainerPath)
				}
				continue
			}
			c.do(addMount{container: ref, mount: &mounts[i].use, prepared: mounts[i].useJSON, list: list})
			used[name] = true
		}
		r.mergeLDLibraryPath(c, ref, libs)
	}
	return used, containers
}

// pinToLayout keeps the pod on the layout's nodes. A static layout and a
// pool bring their own selector; the pool's labels are ones the autoscaler
// knows, so it can add a node for the pod.
func pinToLayout(c *change, l *Layout) {
	if len(l.PoolLabels) > 1 {
		pinToPools(c, l.PoolLabels)
		if c.pod.Labels[layout.LabelPinnedLayout] != l.Fingerprint {
			c.do(setLabel{key: layout.LabelPinnedLayout, value: l.Fingerprint})
		}
		return
	}
	selector := l.NodeSelector
	if l.Static == "" && l.Pool == "" {
		selector = map[string]string{layout.LabelFingerprint: l.Fingerprint}
	}
	for _, k := range sortedKeys(selector) {
		v := selector[k]
		if have, ok := c.pod.Spec.NodeSelector[k]; ok {
			if have != v {
				c.warn("pod's nodeSelector %s=%s conflicts with the layout's %s=%s; kept the pod's", k, have, k, v)
			}
			continue
		}
		c.do(addNodeSelector{key: k, value: v})
	}
	if l.Pool != "" && c.pod.Labels[layout.LabelPinnedLayout] != l.Fingerprint {
		// Lets the elected replica find a pod that lands on a node of the
		// pool with another layout, watching only such pods.
		c.do(setLabel{key: layout.LabelPinnedLayout, value: l.Fingerprint})
	}
}

// forceReadOnly makes every mount of an injected volume read-only, in every
// kind of container: the names are predictable, and a hostPath volume has no
// read-only flag of its own, so a mount the user (or another webhook) wrote
// could otherwise reach the host's driver read-write.
func forceReadOnly(ch *change, injected []string) {
	pod := ch.pod
	fix := func(kind string, ref containerRef) {
		c := ref.get(pod)
		for i := range c.VolumeMounts {
			vm := &c.VolumeMounts[i]
			if !slices.Contains(injected, vm.Name) || recursivelyReadOnly(vm) {
				continue
			}
			if vm.ReadOnly {
				ch.warn("%s %q mounts the injected volume %q read-only at %s, but not what is mounted below it; made it recursively read-only", kind, c.Name, vm.Name, vm.MountPath)
			} else {
				ch.warn("%s %q mounts the injected volume %q read-write at %s; made it recursively read-only", kind, c.Name, vm.Name, vm.MountPath)
			}
			ch.do(readOnlyMount{container: ref, index: i})
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

// recursivelyReadOnly reports whether a mount is read-only down to what is
// mounted below its host path, as readOnlyUse mounts an injected volume:
// readOnly alone leaves a submount of the host's driver folder writable.
func recursivelyReadOnly(vm *corev1.VolumeMount) bool {
	r := vm.RecursiveReadOnly
	return vm.ReadOnly && r != nil && (*r == corev1.RecursiveReadOnlyIfPossible || *r == corev1.RecursiveReadOnlyEnabled)
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
// which an injected mount would either duplicate or be hidden by; injected
// are the names of the injected volumes.
func shadowingMount(c *corev1.Container, p string, injected []string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		vm := &c.VolumeMounts[i]
		if slices.Contains(injected, vm.Name) {
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
// LD_LIBRARY_PATH without dropping what the spec already sets, nor what
// its image sets when the registry said so: a value in env overrides the
// image's ENV, so the image's folders are written too.
func (r *request) mergeLDLibraryPath(ch *change, ref containerRef, libs []string) {
	if r.cfg.LDLibraryPath == config.LDLibraryPathOff || len(libs) == 0 {
		return
	}
	c := ref.get(ch.pod)
	idx := -1
	for i, e := range c.Env {
		if e.Name == envLDLibraryPath {
			idx = i
		}
	}
	if idx < 0 {
		if len(c.EnvFrom) == 0 {
			if old, ok := r.imageLDLibraryPath(c); ok {
				r.mergeImageLDLibraryPath(ch, ref, old, libs)
				return
			}
			if n := r.imageLDLibraryPathTooLong(c); n > 0 {
				ch.warn("container %q: its image's %s is %d bytes, more than the %d a real one needs; ignored, so the container gets only the driver's folders: set it in the container's env if the image needs it",
					c.Name, envLDLibraryPath, n, MaxImageLDLibraryPath)
			}
		}
		value := strings.Join(libs, ":")
		if len(c.EnvFrom) > 0 {
			// env overrides envFrom: refer to the envFrom value, which the
			// kubelet expands, so a value set there is kept, not replaced.
			fromEnv := "$(" + envLDLibraryPath + ")"
			if r.cfg.LDLibraryPath == config.LDLibraryPathPrepend {
				value += ":" + fromEnv
			} else {
				value = fromEnv + ":" + value
			}
			ch.warn("container %q takes env from envFrom, which may set %s: set it to %q so the kubelet keeps that value", c.Name, envLDLibraryPath, value)
		}
		ch.do(addEnv{container: ref, env: corev1.EnvVar{Name: envLDLibraryPath, Value: value}})
		return
	}
	e := &c.Env[idx]
	if e.ValueFrom != nil {
		ch.warn("container %q takes %s from a reference; left as is, add %s to it yourself", c.Name, envLDLibraryPath, strings.Join(libs, ":"))
		return
	}
	old := e.Value
	value, changed := r.mergedPath(old, libs)
	if !changed {
		return
	}
	ch.do(setEnvValue{container: ref, index: idx, value: value})
	ch.warn("container %q: %s %q merged with the driver's folders: %q", c.Name, envLDLibraryPath, truncate(old, warnValueBytes), truncate(value, warnValueBytes))
}

// MaxImageLDLibraryPath bounds the image LD_LIBRARY_PATH the webhook writes
// into a pod's env: a real one names a few folders (CUDA images about 100
// bytes), while the registry may send 256 KiB of ENV, which the patch would
// carry once per container. A longer one is ignored, with a warning.
const MaxImageLDLibraryPath = 4 << 10

// warnValueBytes is how much of a value a warning quotes: the warnings go
// back in the admission response, once per container.
const warnValueBytes = 256

// imageLDLibraryPath is the non-empty LD_LIBRARY_PATH of the container's
// image, when its registry said, and it is within MaxImageLDLibraryPath.
func (r *request) imageLDLibraryPath(c *corev1.Container) (string, bool) {
	f := r.images[c.Image]
	if f == nil {
		return "", false
	}
	v, _ := f.Getenv(envLDLibraryPath)
	if v == "" || len(v) > MaxImageLDLibraryPath {
		return "", false
	}
	return v, true
}

// imageLDLibraryPathTooLong is the length of the image's LD_LIBRARY_PATH
// when it is over MaxImageLDLibraryPath, else 0.
func (r *request) imageLDLibraryPathTooLong(c *corev1.Container) int {
	f := r.images[c.Image]
	if f == nil {
		return 0
	}
	if v, _ := f.Getenv(envLDLibraryPath); len(v) > MaxImageLDLibraryPath {
		return len(v)
	}
	return 0
}

// mergeImageLDLibraryPath writes the image's LD_LIBRARY_PATH with the
// driver's folders merged in, or nothing when the image lists them all
// (CUDA images list /usr/local/nvidia/lib64): its ENV then serves as is.
func (r *request) mergeImageLDLibraryPath(ch *change, ref containerRef, old string, libs []string) {
	value, changed := r.mergedPath(old, libs)
	if !changed {
		return
	}
	c := ref.get(ch.pod)
	ch.do(addEnv{container: ref, env: corev1.EnvVar{Name: envLDLibraryPath, Value: value}})
	ch.warn("container %q: its image's %s %q merged with the driver's folders: %q", c.Name, envLDLibraryPath, truncate(old, warnValueBytes), truncate(value, warnValueBytes))
}

// mergedPath is old with the folders of libs it lacks, after it or before
// it as ldLibraryPath says, and whether that differs from old.
func (r *request) mergedPath(old string, libs []string) (string, bool) {
	have := strings.Split(old, ":")
	var missing []string
	for _, l := range libs {
		if !slices.Contains(have, l) {
			missing = append(missing, l)
		}
	}
	switch {
	case len(missing) == 0:
		return old, false
	case old == "":
		return strings.Join(missing, ":"), true
	case r.cfg.LDLibraryPath == config.LDLibraryPathPrepend:
		return strings.Join(missing, ":") + ":" + old, true
	default:
		return old + ":" + strings.Join(missing, ":"), true
	}
}
