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

// legacyDriverDir is where the classic recipes (Kubernetes 1.6-1.9 docs,
// acs-engine, GKE) put the driver inside containers.
const legacyDriverDir = "/usr/local/nvidia"

// legacyHostDriverPaths are driver folders of the old recipes that no probe
// publishes and the allowlist rightly lacks: nvidia-docker 1.0 assembled the
// driver in a volume per version, which tutorials mounted at /usr/local/nvidia.
var legacyHostDriverPaths = []string{"/var/lib/nvidia-docker/volumes/nvidia_driver/*"}

// legacyMount is a GPU container's hand-written mount of a driver folder or
// file at a driver location: the recipe of the classic tutorials.
type legacyMount struct {
	container containerRef
	// name is the container's name.
	name string
	// volumeMount is the container's mount, as written.
	volumeMount corev1.VolumeMount
	hostPath    string
}

// legacyMounts finds the hand-written driver mounts of the target containers,
// in container and mount order. The volumes an earlier injection's record
// lists (recorded) are not hand-written.
func (r *request) legacyMounts(pod *corev1.Pod, targets []containerRef, layouts []*Layout, recorded []string) []legacyMount {
	// A name two volumes share is ambiguous: which one a mount means is not
	// said (the API server refuses such a pod after admission), so neither
	// is replaced.
	seen := make(map[string]int, len(pod.Spec.Volumes))
	for _, v := range pod.Spec.Volumes {
		seen[v.Name]++
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath == nil || seen[v.Name] > 1 || slices.Contains(recorded, v.Name) || !path.IsAbs(v.HostPath.Path) {
			continue
		}
		if p := path.Clean(v.HostPath.Path); r.isDriverPath(p, layouts) || r.isSharedDriverFolder(p) {
			hostPaths[v.Name] = p
		}
	}
	if len(hostPaths) == 0 {
		return nil
	}
	var out []legacyMount
	for _, ref := range targets {
		c := ref.get(pod)
		for _, vm := range c.VolumeMounts {
			hp, ok := hostPaths[vm.Name]
			if !ok || vm.SubPath != "" || vm.SubPathExpr != "" {
				continue
			}
			if !path.IsAbs(vm.MountPath) {
				continue
			}
			mp := path.Clean(vm.MountPath)
			// A whole shared folder (/usr/bin, /usr/lib64) is the driver's
			// only where the recipes put the driver; anywhere else it is the
			// user's business.
			if r.isSharedDriverFolder(hp) && !r.isClassicLocation(mp) || !r.isDriverLocation(mp, layouts) {
				continue
			}
			out = append(out, legacyMount{container: ref, name: c.Name, volumeMount: vm, hostPath: hp})
		}
	}
	return out
}

// isDriverPath reports whether p is a driver folder or file: one the host path
// allowlist admits (a driver folder, or a driver file in a shared system
// folder), or a published layout's host path or a path inside one.
func (r *request) isDriverPath(p string, layouts []*Layout) bool {
	// The walks up the folders below end at "/": only a clean absolute path
	// gets there (a pod's mountPath may be anything).
	if p == "/" || !path.IsAbs(p) || path.Clean(p) != p {
		return false
	}
	for _, a := range r.cfg.HostPaths.Entries() {
		if a.FilesOnly {
			if ok, _ := path.Match(a.Path, path.Dir(p)); ok && r.isDriverFileName(path.Base(p)) {
				return true
			}
			continue
		}
		for q := p; q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(a.Path, q); ok {
				return true
			}
		}
	}
	for _, l := range layouts {
		if layoutHasHostPath(l.Plan, p) {
			return true
		}
	}
	for _, pat := range legacyHostDriverPaths {
		for q := p; q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(pat, q); ok {
				return true
			}
		}
	}
	return false
}

// isSharedDriverFolder reports whether p is a shared system folder that holds
// driver files (a filesOnly allowlist entry): the recipes mounted /usr/bin or
// /usr/lib64/nvidia's parent whole to reach nvidia-smi or libcuda.
func (r *request) isSharedDriverFolder(p string) bool {
	for _, a := range r.cfg.HostPaths.Entries() {
		if ok, _ := path.Match(a.Path, p); ok && a.FilesOnly {
			return true
		}
	}
	return false
}

// isClassicLocation reports whether a container path is under /usr/local/nvidia
// or the configured container folders.
func (r *request) isClassicLocation(p string) bool {
	for _, d := range []string{legacyDriverDir, r.cfg.ContainerPaths.LibraryDir, r.cfg.ContainerPaths.BinaryDir} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func (r *request) isDriverFileName(name string) bool {
	for _, pat := range r.cfg.HostPaths.DriverFilePatterns {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}

// isDriverLocation reports whether a container path is where a driver goes:
// the classic /usr/local/nvidia, the configured container folders, or a path
// that mirrors a driver path of the host (/usr/lib/nvidia,
// /usr/lib/x86_64-linux-gnu/libcuda.so.1).
//
// Also any folder named nvidia*: operators' configs put the driver's tools at
// /usr/local/bin/nvidia, for instance.
func (r *request) isDriverLocation(p string, layouts []*Layout) bool {
	if r.isClassicLocation(p) || r.isDriverPath(p, layouts) {
		return true
	}
	for _, el := range strings.Split(p, "/") {
		if strings.HasPrefix(el, "nvidia") {
			return true
		}
	}
	return false
}

// layoutHasHostPath reports whether the plan mounts host path p, or a folder
// that holds it: where that path exists on the layout's nodes.
func layoutHasHostPath(plan layout.Plan, p string) bool {
	for _, mt := range plan.Mounts {
		if p == mt.HostPath || (mt.Kind == layout.KindDirectory && strings.HasPrefix(p, mt.HostPath+"/")) {
			return true
		}
	}
	return false
}

// holdsLegacy reports whether a plan's host paths hold every hand-mounted
// one, so that the pod may keep its mounts (legacyMounts: Keep) on its nodes.
func holdsLegacy(plan layout.Plan, legacy []legacyMount) bool {
	if plan.RuntimeInjection != "" {
		return false
	}
	for _, lm := range legacy {
		if !layoutHasHostPath(plan, lm.hostPath) {
			return false
		}
	}
	return true
}

// legacyKeptWhy says why no layout fits a pod whose hand-written driver
// mounts are kept.
func legacyKeptWhy(legacy []legacyMount) string {
	return fmt.Sprintf("the pod mounts the driver by hand (%s) and legacyMounts is %s: no ready layout has %s; remove those volumes to have the node's driver injected",
		describeLegacy(legacy), config.LegacyMountsKeep, strings.Join(legacyHostPaths(legacy), ", "))
}

func legacyHostPaths(legacy []legacyMount) []string {
	var out []string
	for _, lm := range legacy {
		if !slices.Contains(out, lm.hostPath) {
			out = append(out, lm.hostPath)
		}
	}
	return out
}

func describeLegacy(legacy []legacyMount) string {
	var parts []string
	for _, lm := range legacy {
		parts = append(parts, fmt.Sprintf("host %s at %s in container %q", lm.hostPath, lm.volumeMount.MountPath, lm.name))
	}
	return strings.Join(parts, ", ")
}

// replacement says what takes a hand-written mount's place: the layout's
// mounts at, above or below its container path, else all of them; more than
// two are summed up by folder.
func replacement(l *Layout, mountPath string) string {
	if l.Runtime {
		return "the driver that the node's gpu-injector NRI plugin mounts when the container is created"
	}
	if l.Plan.RuntimeInjection != "" {
		return fmt.Sprintf("the driver %s that %s injects (%s)", l.Plan.DriverVersion, injectedBy(l.Plan.RuntimeInjection), l.Plan.RuntimeInjection)
	}
	mp := path.Clean(mountPath)
	var near []layout.Mount
	for _, mt := range l.Plan.Mounts {
		if mt.ContainerPath == mp || strings.HasPrefix(mt.ContainerPath, mp+"/") || strings.HasPrefix(mp, mt.ContainerPath+"/") {
			near = append(near, mt)
		}
	}
	if len(near) == 0 {
		near = l.Plan.Mounts
	}
	what := "layout " + l.Fingerprint
	if l.Static != "" {
		what = "static layout " + l.Static
	}
	var parts []string
	if len(near) <= 2 {
		for _, mt := range near {
			parts = append(parts, fmt.Sprintf("%s at %s", mt.HostPath, mt.ContainerPath))
		}
	} else {
		var hosts, conts []string
		for _, mt := range near {
			h, c := mt.HostPath, mt.ContainerPath
			if mt.Kind == layout.KindFile {
				h, c = path.Dir(h), path.Dir(c)
			}
			if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
			if !slices.Contains(conts, c) {
				conts = append(conts, c)
			}
		}
		parts = append(parts, fmt.Sprintf("%d mounts from %s at %s", len(near), strings.Join(hosts, " and "), strings.Join(conts, " and ")))
	}
	return fmt.Sprintf("%s of %s (driver %s)", strings.Join(parts, ", "), what, l.Plan.DriverVersion)
}

// replaceLegacy drops the hand-written driver mounts, and each volume that no
// container mounts any more, saying what replaces them.
func replaceLegacy(c *change, legacy []legacyMount, l *Layout) {
	pod := c.pod
	for _, lm := range legacy {
		ctr := lm.container.get(pod)
		i := slices.IndexFunc(ctr.VolumeMounts, func(vm corev1.VolumeMount) bool {
			return vm.Name == lm.volumeMount.Name && vm.MountPath == lm.volumeMount.MountPath
		})
		if i < 0 {
			continue
		}
		c.do(removeMount{container: lm.container, index: i})
		c.warn("container %q: the hand-written driver mount of host path %s at %s is replaced by %s",
			lm.name, lm.hostPath, lm.volumeMount.MountPath, replacement(l, lm.volumeMount.MountPath))
	}
	done := map[string]bool{}
	for _, lm := range legacy {
		name := lm.volumeMount.Name
		if done[name] {
			continue
		}
		done[name] = true
		if users := volumeUsers(pod, name); len(users) > 0 {
			c.warn("volume %q (host path %s) is kept: still mounted by %s", name, lm.hostPath, strings.Join(users, ", "))
			continue
		}
		if i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }); i >= 0 {
			c.do(removeVolume{index: i})
		}
	}
}

// volumeUsers names the containers of every kind that mount a volume.
func volumeUsers(pod *corev1.Pod, volume string) []string {
	var out []string
	check := func(kind, name string, mounts []corev1.VolumeMount) {
		for _, vm := range mounts {
			if vm.Name == volume {
				out = append(out, fmt.Sprintf("%s %q", kind, name))
				return
			}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		check("init container", c.Name, c.VolumeMounts)
	}
	for _, c := range pod.Spec.Containers {
		check("container", c.Name, c.VolumeMounts)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		check("ephemeral container", c.Name, c.VolumeMounts)
	}
	return out
}

// injectedBy names what puts the driver into containers on a node whose
// layout has runtimeInjection: a user who reads "container runtime" on GKE
// would look for a toolkit that is not there.
func injectedBy(kind string) string {
	if kind == layout.RuntimeDevicePlugin {
		return "the node's device plugin"
	}
	return "the node's container runtime"
}
