//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

// defaultPath is what container runtimes set when the image and the pod set no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Mount types of a mountSpec.
const (
	mountBind  = "bind"
	mountTmpfs = "tmpfs"
)

// mountSpec is one mount the child makes; Source is a host path.
type mountSpec struct {
	Volume   string `json:"volume,omitempty"`
	Type     string `json:"type"`
	Source   string `json:"source,omitempty"`
	Target   string `json:"target"`
	Dir      bool   `json:"dir"`
	ReadOnly bool   `json:"readOnly"`
}

// runPlan is everything the child needs, resolved on the host by the parent
// so that errors come early and name the pod's fields.
type runPlan struct {
	Root       string      `json:"root"`
	Scratch    string      `json:"scratch"`
	Overlay    bool        `json:"overlay"`
	NoPivot    bool        `json:"noPivot"`
	Devices    []mountSpec `json:"devices"`
	Mounts     []mountSpec `json:"mounts"`
	Argv       []string    `json:"argv"`
	Env        []string    `json:"env"`
	WorkingDir string      `json:"workingDir"`
	Hostname   string      `json:"hostname"`
	UID        *int64      `json:"uid,omitempty"`
	GID        *int64      `json:"gid,omitempty"`
	Groups     []int64     `json:"groups,omitempty"`
}

// options are podsim's flags that shape the plan.
type options struct {
	Root       string
	Overlay    bool
	GPUDevices bool
	HostDev    string
	NodeName   string
	// HostRoot is where the node's / is: hostPaths are taken under it, with
	// the node's symlinks resolved inside it. Empty or "/" means this host.
	HostRoot string
	// Argv, when set, replaces the container's command and args.
	Argv []string
}

// buildPlan turns a pod and one of its containers into a runPlan, and returns
// warnings for the user. It reads (and for *OrCreate types, creates) host paths
// the way a kubelet would.
func buildPlan(pod podCandidate, c *corev1.Container, o options) (*runPlan, []string, error) {
	var warnings []string
	p := &runPlan{Root: o.Root, Overlay: o.Overlay, Hostname: hostnameOf(pod)}

	env, err := containerEnv(pod, c, o.NodeName)
	if err != nil {
		return nil, nil, err
	}
	p.Env = env
	switch {
	case len(o.Argv) > 0:
		p.Argv = append([]string(nil), o.Argv...)
	case len(c.Command) == 0:
		return nil, nil, fmt.Errorf("container %q sets no command: podsim cannot know the image's entrypoint, so the container must set command (or give one after --)", c.Name)
	default:
		lookup := envLookup(env)
		for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
			p.Argv = append(p.Argv, expand(a, lookup))
		}
	}
	p.WorkingDir = "/"
	if c.WorkingDir != "" {
		p.WorkingDir = path.Clean("/" + c.WorkingDir)
	}
	if len(c.VolumeDevices) > 0 {
		return nil, nil, fmt.Errorf("container %q: podsim does not support volumeDevices", c.Name)
	}
	if len(c.EnvFrom) > 0 {
		return nil, nil, fmt.Errorf("container %q: podsim does not support envFrom", c.Name)
	}

	injected := injectedVolumes(pod)
	volumes := make(map[string]*corev1.Volume, len(pod.Spec.Volumes))
	for i := range pod.Spec.Volumes {
		volumes[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, nil, fmt.Errorf("container %q mounts volume %q that the pod does not define", c.Name, vm.Name)
		}
		m, err := mountOf(v, vm, o.HostRoot)
		if err != nil {
			return nil, nil, err
		}
		if injected[vm.Name] && !m.ReadOnly {
			warnings = append(warnings, fmt.Sprintf("volume %q was injected by gpu-injector but is mounted read-write at %s", vm.Name, m.Target))
		}
		p.Mounts = append(p.Mounts, m)
	}
	// Parents before children, as containerd orders a container's mounts.
	sort.SliceStable(p.Mounts, func(i, j int) bool {
		return strings.Count(p.Mounts[i].Target, "/") < strings.Count(p.Mounts[j].Target, "/")
	})

	if o.GPUDevices {
		devs, err := gpuDevices(o.HostDev)
		if err != nil {
			return nil, nil, err
		}
		p.Devices = devs
	}

	uid, gid, groups := identityOf(&pod.Spec, c)
	p.UID, p.GID, p.Groups = uid, gid, groups
	return p, warnings, nil
}

func hostnameOf(pod podCandidate) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = h[:63]
	}
	if h == "" {
		h = "podsim"
	}
	return h
}

// injectedVolumes reads the webhook's record of the volumes it added.
func injectedVolumes(pod podCandidate) map[string]bool {
	out := map[string]bool{}
	raw, ok := pod.Meta.Annotations[layout.AnnotationInjected]
	if !ok {
		return out
	}
	var rec layout.Injected
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return out
	}
	for _, v := range rec.Volumes {
		out[v] = true
	}
	return out
}

func mountOf(v *corev1.Volume, vm corev1.VolumeMount, hostRoot string) (mountSpec, error) {
	target := path.Clean("/" + vm.MountPath)
	if vm.MountPath == "" || target == "/" {
		return mountSpec{}, fmt.Errorf("volume mount %q: mountPath %q is not a mountable folder", vm.Name, vm.MountPath)
	}
	if vm.SubPathExpr != "" {
		return mountSpec{}, fmt.Errorf("volume mount %q: podsim does not support subPathExpr", vm.Name)
	}
	m := mountSpec{Volume: vm.Name, Target: target, ReadOnly: vm.ReadOnly}
	switch {
	case v.HostPath != nil:
		src, dir, err := hostPathSource(v.Name, v.HostPath, vm.SubPath, hostRoot)
		if err != nil {
			return mountSpec{}, err
		}
		m.Type, m.Source, m.Dir = mountBind, src, dir
	case v.EmptyDir != nil:
		if vm.SubPath != "" {
			return mountSpec{}, fmt.Errorf("volume mount %q: podsim does not support subPath on emptyDir", vm.Name)
		}
		m.Type, m.Dir = mountTmpfs, true
	default:
		return mountSpec{}, fmt.Errorf("volume %q: podsim supports hostPath and emptyDir volumes, not %s", v.Name, volumeSourceName(v))
	}
	return m, nil
}

// hostPathSource checks a hostPath volume the way the kubelet does for its
// type, creating the path for the *OrCreate types, and says whether it is a folder.
func hostPathSource(name string, hp *corev1.HostPathVolumeSource, subPath, hostRoot string) (string, bool, error) {
	if !filepath.IsAbs(hp.Path) {
		return "", false, fmt.Errorf("volume %q: hostPath %q is not absolute", name, hp.Path)
	}
	src := filepath.Clean(hp.Path)
	if hostRoot != "" && hostRoot != "/" {
		var err error
		if src, err = resolveIn(hostRoot, src); err != nil {
			return "", false, fmt.Errorf("volume %q: %w", name, err)
		}
	}
	typ := corev1.HostPathUnset
	if hp.Type != nil {
		typ = *hp.Type
	}
	switch typ {
	case corev1.HostPathDirectoryOrCreate:
		if err := os.MkdirAll(src, 0o755); err != nil {
			return "", false, fmt.Errorf("failed to create hostPath %q of volume %q: %w", src, name, err)
		}
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
			return "", false, fmt.Errorf("failed to create the folder of hostPath %q of volume %q: %w", src, name, err)
		}
		f, err := os.OpenFile(src, os.O_RDONLY|os.O_CREATE, 0o644)
		if err != nil {
			return "", false, fmt.Errorf("failed to create hostPath %q of volume %q: %w", src, name, err)
		}
		_ = f.Close()
	}
	fi, err := os.Stat(src)
	if err != nil {
		return "", false, fmt.Errorf("failed to stat hostPath %q of volume %q: %w", src, name, err)
	}
	mode := fi.Mode()
	want := map[corev1.HostPathType]func() bool{
		corev1.HostPathDirectory:         mode.IsDir,
		corev1.HostPathDirectoryOrCreate: mode.IsDir,
		corev1.HostPathFile:              mode.IsRegular,
		corev1.HostPathFileOrCreate:      mode.IsRegular,
		corev1.HostPathSocket:            func() bool { return mode&fs.ModeSocket != 0 },
		corev1.HostPathCharDev:           func() bool { return mode&fs.ModeCharDevice != 0 },
		corev1.HostPathBlockDev:          func() bool { return mode&fs.ModeDevice != 0 && mode&fs.ModeCharDevice == 0 },
	}
	if check, ok := want[typ]; ok && !check() {
		return "", false, fmt.Errorf("volume %q: hostPath %q is not of type %s (it is %s)", name, src, typ, mode.Type())
	} else if !ok && typ != corev1.HostPathUnset {
		return "", false, fmt.Errorf("volume %q: unknown hostPath type %q", name, typ)
	}
	if subPath == "" {
		return src, fi.IsDir(), nil
	}
	clean := filepath.Clean(subPath)
	if filepath.IsAbs(subPath) || clean == ".." || strings.HasPrefix(clean, "../") {
		return "", false, fmt.Errorf("volume %q: subPath %q must be a relative path inside the volume", name, subPath)
	}
	full := filepath.Join(src, clean)
	sfi, err := os.Stat(full)
	if err != nil {
		return "", false, fmt.Errorf("failed to stat subPath %q of volume %q: %w", subPath, name, err)
	}
	return full, sfi.IsDir(), nil
}

func volumeSourceName(v *corev1.Volume) string {
	b, err := json.Marshal(v.VolumeSource)
	if err != nil {
		return "this volume type"
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || len(m) == 0 {
		return "a volume without a source"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

// gpuDevices lists the host's NVIDIA device nodes: in a cluster the NVIDIA
// device plugin (or CDI) puts them into the container, not gpu-injector.
func gpuDevices(hostDev string) ([]mountSpec, error) {
	matches, err := filepath.Glob(filepath.Join(hostDev, "nvidia*"))
	if err != nil {
		return nil, fmt.Errorf("failed to list GPU devices in %q: %w", hostDev, err)
	}
	sort.Strings(matches)
	var out []mountSpec
	for _, m := range matches {
		fi, err := os.Stat(m)
		if err != nil {
			return nil, fmt.Errorf("failed to stat GPU device %q: %w", m, err)
		}
		if !fi.IsDir() && fi.Mode()&fs.ModeCharDevice == 0 {
			continue
		}
		out = append(out, mountSpec{Type: mountBind, Source: m, Target: "/dev/" + filepath.Base(m), Dir: fi.IsDir()})
	}
	return out, nil
}

func identityOf(spec *corev1.PodSpec, c *corev1.Container) (uid, gid *int64, groups []int64) {
	if psc := spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
		groups = psc.SupplementalGroups
	}
	if csc := c.SecurityContext; csc != nil {
		if csc.RunAsUser != nil {
			uid = csc.RunAsUser
		}
		if csc.RunAsGroup != nil {
			gid = csc.RunAsGroup
		}
	}
	return uid, gid, groups
}

// containerEnv is the container's environment as the kubelet computes it
// (values, field references, $(VAR) expansion), plus the runtime's default
// PATH. Nothing of podsim's own environment leaks in.
func containerEnv(pod podCandidate, c *corev1.Container, nodeName string) ([]string, error) {
	var names []string
	values := map[string]string{}
	for _, e := range c.Env {
		var val string
		switch {
		case e.ValueFrom == nil:
			val = expand(e.Value, func(k string) (string, bool) { v, ok := values[k]; return v, ok })
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath, nodeName)
			if err != nil {
				return nil, fmt.Errorf("container %q env %q: %w", c.Name, e.Name, err)
			}
			val = v
		default:
			return nil, fmt.Errorf("container %q env %q: podsim supports value and fieldRef, not configMap, secret or resource references", c.Name, e.Name)
		}
		if _, seen := values[e.Name]; !seen {
			names = append(names, e.Name)
		}
		values[e.Name] = val
	}
	if _, ok := values["PATH"]; !ok {
		names = append(names, "PATH")
		values["PATH"] = defaultPath
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, n+"="+values[n])
	}
	return out, nil
}

func fieldValue(pod podCandidate, fieldPath, nodeName string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		if pod.Namespace == "" {
			return "default", nil
		}
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.Meta.UID), nil
	case "spec.nodeName":
		return nodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Meta.Labels, "metadata.annotations": pod.Meta.Annotations} {
		if strings.HasPrefix(fieldPath, prefix+"['") && strings.HasSuffix(fieldPath, "']") {
			return m[strings.TrimSuffix(strings.TrimPrefix(fieldPath, prefix+"['"), "']")], nil
		}
	}
	return "", fmt.Errorf("podsim does not support fieldRef %q", fieldPath)
}

func envLookup(env []string) func(string) (string, bool) {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// expand replaces $(VAR) with the value of VAR the way the kubelet does for
// env values, command and args: an undefined VAR stays as written and $$
// escapes a dollar.
func expand(in string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	checkpoint := 0
	for cur := 0; cur < len(in); cur++ {
		if in[cur] != '$' || cur+1 >= len(in) {
			continue
		}
		b.WriteString(in[checkpoint:cur])
		read, isVar, advance := readVariable(in[cur+1:])
		switch {
		case !isVar:
			b.WriteString(read)
		default:
			if v, ok := lookup(read); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + read + ")")
			}
		}
		cur += advance
		checkpoint = cur + 1
	}
	return b.String() + in[checkpoint:]
}

// readVariable reads what follows a '$': the text to write or the variable
// name, whether it is a name, and how many bytes it consumed.
func readVariable(in string) (string, bool, int) {
	switch in[0] {
	case '$':
		return "$", false, 1
	case '(':
		for i := 1; i < len(in); i++ {
			if in[i] == ')' {
				return in[1:i], true, i + 1
			}
		}
		return "$(", false, 1
	default:
		return "$" + in[:1], false, 1
	}
}
