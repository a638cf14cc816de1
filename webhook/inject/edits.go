package inject

import (
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// Edit is one change the mutation makes to a pod: the one representation of
// what is injected. Mutate makes each edit on its typed pod, so that later
// decisions (and a second run) see it, and records the JSON Patch operations
// that make the same change to the pod's JSON: the webhook answers with those
// operations and `gpu-injector mutate` applies them to the document, so
// neither diffs the pod and a field this build does not know is never touched.
//
// To add an edit kind: write a small struct that names its target by
// position (a containerRef, an index into a list) as the pod stands when the
// edit is made; give it ops, the operations against the pod's JSON as it
// stands before the edit, and apply, the same change on the typed pod; make it
// from Mutate through editor.do, never by writing the pod directly. Prefer
// "add" (it also replaces an object member that is present) and, for a list
// or map that may be empty or absent in the JSON, add the whole list or map
// (see appendOp and setKeyOp). TestGolden applies the operations to each
// input's JSON and checks the result against apply's pod.
type Edit interface {
	// ops are the JSON Patch operations for this edit, against pod as it
	// stands before the edit is applied.
	// They are appended to out.
	ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation
	// apply makes the edit on the typed pod.
	apply(pod *corev1.Pod)
}

// editor makes edits on a pod and collects them and their operations.
type editor struct {
	pod   *corev1.Pod
	edits []Edit
	patch []jsonpatch.Operation
}

func (e *editor) do(ed Edit) {
	e.patch = ed.ops(e.pod, e.patch)
	ed.apply(e.pod)
	e.edits = append(e.edits, ed)
}

func (e *editor) changed() bool { return len(e.edits) > 0 }

// containerRef names a container by its list and index, which is also its
// place in the pod's JSON.
type containerRef struct {
	list  containerList
	index int
}

type containerList string

const (
	initContainers      containerList = "initContainers"
	appContainers       containerList = "containers"
	ephemeralContainers containerList = "ephemeralContainers"
)

func (r containerRef) path() string {
	return "/spec/" + string(r.list) + "/" + strconv.Itoa(r.index)
}

// get returns the container; ephemeral containers are reduced to their
// common part, which is all an edit touches.
func (r containerRef) get(pod *corev1.Pod) *corev1.Container {
	switch r.list {
	case initContainers:
		return &pod.Spec.InitContainers[r.index]
	case ephemeralContainers:
		return (*corev1.Container)(&pod.Spec.EphemeralContainers[r.index].EphemeralContainerCommon)
	default:
		return &pod.Spec.Containers[r.index]
	}
}

// containerRefs lists init containers first, as the kubelet runs them, then
// the app containers.
func containerRefs(pod *corev1.Pod) []containerRef {
	out := make([]containerRef, 0, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
	for i := range pod.Spec.InitContainers {
		out = append(out, containerRef{initContainers, i})
	}
	for i := range pod.Spec.Containers {
		out = append(out, containerRef{appContainers, i})
	}
	return out
}

// pointerEscape escapes a map key for a JSON Pointer (RFC 6901).
func pointerEscape(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// appendOp appends to the list at path; an empty list may be null or absent
// in the JSON, where "path/-" fails, so the first item comes as a list.
func appendOp(path string, n int, item any) jsonpatch.Operation {
	if n == 0 {
		return jsonpatch.Operation{Operation: "add", Path: path, Value: []any{item}}
	}
	return jsonpatch.Operation{Operation: "add", Path: path + "/-", Value: item}
}

// setKeyOp sets one key of the map at path; an empty map may be null or
// absent in the JSON, so the first key comes as a map.
func setKeyOp(path string, n int, key string, value any) jsonpatch.Operation {
	if n == 0 {
		return jsonpatch.Operation{Operation: "add", Path: path, Value: map[string]any{key: value}}
	}
	return jsonpatch.Operation{Operation: "add", Path: path + "/" + pointerEscape(key), Value: value}
}

// resourceList is "limits" or "requests" of a container's resources.
type resourceList string

const (
	limits   resourceList = "limits"
	requests resourceList = "requests"
)

func (l resourceList) of(c *corev1.Container) corev1.ResourceList {
	if l == limits {
		return c.Resources.Limits
	}
	return c.Resources.Requests
}

func (l resourceList) set(c *corev1.Container, rl corev1.ResourceList) {
	if l == limits {
		c.Resources.Limits = rl
	} else {
		c.Resources.Requests = rl
	}
}

func (l resourceList) path(c containerRef) string {
	return c.path() + "/resources/" + string(l)
}

// renameResource moves a resource from one name to another in one list;
// keep leaves a value already under the new name as it is.
type renameResource struct {
	container containerRef
	list      resourceList
	from, to  corev1.ResourceName
	quantity  resource.Quantity
	keep      bool
}

func (e renameResource) ops(_ *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	p := e.list.path(e.container)
	out = append(out, jsonpatch.Operation{Operation: "remove", Path: p + "/" + pointerEscape(string(e.from))})
	if !e.keep {
		out = append(out, jsonpatch.Operation{Operation: "add", Path: p + "/" + pointerEscape(string(e.to)), Value: e.quantity})
	}
	return out
}

func (e renameResource) apply(pod *corev1.Pod) {
	rl := e.list.of(e.container.get(pod))
	delete(rl, e.from)
	if !e.keep {
		rl[e.to] = e.quantity.DeepCopy()
	}
}

// setResource sets one resource of a list. The container must already have
// a resources object in the JSON, which holds for every caller: the value
// comes from the container's own limits or requests.
type setResource struct {
	container containerRef
	list      resourceList
	name      corev1.ResourceName
	quantity  resource.Quantity
}

func (e setResource) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	rl := e.list.of(e.container.get(pod))
	return append(out, setKeyOp(e.list.path(e.container), len(rl), string(e.name), e.quantity))
}

func (e setResource) apply(pod *corev1.Pod) {
	c := e.container.get(pod)
	rl := e.list.of(c)
	if rl == nil {
		rl = corev1.ResourceList{}
		e.list.set(c, rl)
	}
	rl[e.name] = e.quantity.DeepCopy()
}

// addVolume appends a volume to the pod; prepared, when set, is the
// volume's JSON (a json.RawMessage), made once for every pod of a layout.
// The volume is a layout's, shared by every request: read, never written.
type addVolume struct {
	volume   *corev1.Volume
	prepared any
}

func (e addVolume) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	var v any = e.prepared
	if v == nil {
		v = *e.volume
	}
	return append(out, appendOp("/spec/volumes", len(pod.Spec.Volumes), v))
}

func (e addVolume) apply(pod *corev1.Pod) { pod.Spec.Volumes = append(pod.Spec.Volumes, *e.volume) }

// addMount appends a volume mount to a container; prepared, when set, is
// the mount's JSON (a json.RawMessage), made once for every pod of a layout,
// and list the path of the container's volumeMounts, when the caller has it.
// The mount is shared like addVolume's.
type addMount struct {
	container containerRef
	mount     *corev1.VolumeMount
	prepared  any
	list      string
}

func (e addMount) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	n := len(e.container.get(pod).VolumeMounts)
	list := e.list
	if list == "" {
		list = e.container.path() + "/volumeMounts"
	}
	var v any = e.prepared
	if v == nil {
		v = *e.mount
	}
	return append(out, appendOp(list, n, v))
}

func (e addMount) apply(pod *corev1.Pod) {
	c := e.container.get(pod)
	c.VolumeMounts = append(c.VolumeMounts, *e.mount)
}

// readOnlyMount makes a container's existing mount recursively read-only,
// as readOnlyUse mounts an injected volume: readOnly, recursiveReadOnly
// IfPossible unless it is Enabled, and, as the API server requires of a
// recursively read-only mount, no mount propagation.
type readOnlyMount struct {
	container containerRef
	index     int
}

func (e readOnlyMount) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	vm := e.container.get(pod).VolumeMounts[e.index]
	at := e.container.path() + "/volumeMounts/" + strconv.Itoa(e.index)
	if !vm.ReadOnly {
		out = append(out, jsonpatch.Operation{Operation: "add", Path: at + "/readOnly", Value: true})
	}
	if r := vm.RecursiveReadOnly; r == nil || *r != corev1.RecursiveReadOnlyEnabled {
		out = append(out, jsonpatch.Operation{Operation: "add", Path: at + "/recursiveReadOnly", Value: corev1.RecursiveReadOnlyIfPossible})
	}
	if p := vm.MountPropagation; p != nil && *p != corev1.MountPropagationNone {
		out = append(out, jsonpatch.Operation{Operation: "remove", Path: at + "/mountPropagation"})
	}
	return out
}

func (e readOnlyMount) apply(pod *corev1.Pod) {
	vm := &e.container.get(pod).VolumeMounts[e.index]
	vm.ReadOnly = true
	if r := vm.RecursiveReadOnly; r == nil || *r != corev1.RecursiveReadOnlyEnabled {
		vm.RecursiveReadOnly = ptr.To(corev1.RecursiveReadOnlyIfPossible)
	}
	if p := vm.MountPropagation; p != nil && *p != corev1.MountPropagationNone {
		vm.MountPropagation = nil
	}
}

// addEnv appends an environment variable to a container.
type addEnv struct {
	container containerRef
	env       corev1.EnvVar
}

func (e addEnv) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	n := len(e.container.get(pod).Env)
	return append(out, appendOp(e.container.path()+"/env", n, e.env))
}

func (e addEnv) apply(pod *corev1.Pod) {
	c := e.container.get(pod)
	c.Env = append(c.Env, e.env)
}

// setEnvValue sets the value of a container's existing variable (a merged
// LD_LIBRARY_PATH).
type setEnvValue struct {
	container containerRef
	index     int
	value     string
}

func (e setEnvValue) ops(_ *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, jsonpatch.Operation{Operation: "add", Path: e.container.path() + "/env/" + strconv.Itoa(e.index) + "/value", Value: e.value})
}

func (e setEnvValue) apply(pod *corev1.Pod) {
	e.container.get(pod).Env[e.index].Value = e.value
}

// addNodeSelector sets a node selector key the pod does not have.
type addNodeSelector struct{ key, value string }

func (e addNodeSelector) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, setKeyOp("/spec/nodeSelector", len(pod.Spec.NodeSelector), e.key, e.value))
}

func (e addNodeSelector) apply(pod *corev1.Pod) {
	if pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	pod.Spec.NodeSelector[e.key] = e.value
}

// addToleration appends a toleration to the pod (the one a renamed legacy
// resource would have had).
type addToleration struct{ toleration corev1.Toleration }

func (e addToleration) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, appendOp("/spec/tolerations", len(pod.Spec.Tolerations), e.toleration))
}

func (e addToleration) apply(pod *corev1.Pod) {
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, e.toleration)
}

// setAnnotation sets an annotation (the injection record).
type setAnnotation struct{ key, value string }

func (e setAnnotation) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, setKeyOp("/metadata/annotations", len(pod.Annotations), e.key, e.value))
}

func (e setAnnotation) apply(pod *corev1.Pod) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[e.key] = e.value
}

// setLabel sets a label (the pool pinning marker).
type setLabel struct{ key, value string }

func (e setLabel) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, setKeyOp("/metadata/labels", len(pod.Labels), e.key, e.value))
}

func (e setLabel) apply(pod *corev1.Pod) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[e.key] = e.value
}

// removeMount removes a container's volume mount (a hand-written driver
// mount); the last one goes with its list, which the JSON then lacks.
type removeMount struct {
	container containerRef
	index     int
}

func (e removeMount) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	p := e.container.path() + "/volumeMounts"
	if len(e.container.get(pod).VolumeMounts) == 1 {
		return append(out, jsonpatch.Operation{Operation: "remove", Path: p})
	}
	return append(out, jsonpatch.Operation{Operation: "remove", Path: p + "/" + strconv.Itoa(e.index)})
}

func (e removeMount) apply(pod *corev1.Pod) {
	c := e.container.get(pod)
	if c.VolumeMounts = slices.Delete(c.VolumeMounts, e.index, e.index+1); len(c.VolumeMounts) == 0 {
		c.VolumeMounts = nil
	}
}

// removeEnv removes a container's environment variable (the LD_LIBRARY_PATH
// an earlier injection set); the last one goes with its list.
type removeEnv struct {
	container containerRef
	index     int
}

func (e removeEnv) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	p := e.container.path() + "/env"
	if len(e.container.get(pod).Env) == 1 {
		return append(out, jsonpatch.Operation{Operation: "remove", Path: p})
	}
	return append(out, jsonpatch.Operation{Operation: "remove", Path: p + "/" + strconv.Itoa(e.index)})
}

func (e removeEnv) apply(pod *corev1.Pod) {
	c := e.container.get(pod)
	if c.Env = slices.Delete(c.Env, e.index, e.index+1); len(c.Env) == 0 {
		c.Env = nil
	}
}

// removeKeyOp removes one key of the map at path; the last one goes with
// the map, as a typed pod's empty map is nil.
func removeKeyOp(path string, n int, key string) jsonpatch.Operation {
	if n == 1 {
		return jsonpatch.Operation{Operation: "remove", Path: path}
	}
	return jsonpatch.Operation{Operation: "remove", Path: path + "/" + pointerEscape(key)}
}

// deleteKey deletes a key of a map, which is nil once empty.
func deleteKey(m *map[string]string, key string) {
	delete(*m, key)
	if len(*m) == 0 {
		*m = nil
	}
}

// removeNodeSelector removes a node selector key (an earlier injection's pin).
type removeNodeSelector struct{ key string }

func (e removeNodeSelector) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, removeKeyOp("/spec/nodeSelector", len(pod.Spec.NodeSelector), e.key))
}

func (e removeNodeSelector) apply(pod *corev1.Pod) { deleteKey(&pod.Spec.NodeSelector, e.key) }

// removeLabel removes a label (an earlier injection's pool pinning marker).
type removeLabel struct{ key string }

func (e removeLabel) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, removeKeyOp("/metadata/labels", len(pod.Labels), e.key))
}

func (e removeLabel) apply(pod *corev1.Pod) { deleteKey(&pod.Labels, e.key) }

// removeAnnotation removes an annotation (an earlier injection's record).
type removeAnnotation struct{ key string }

func (e removeAnnotation) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	return append(out, removeKeyOp("/metadata/annotations", len(pod.Annotations), e.key))
}

func (e removeAnnotation) apply(pod *corev1.Pod) { deleteKey(&pod.Annotations, e.key) }

// removeVolume removes a volume of the pod that no container mounts any more.
type removeVolume struct{ index int }

func (e removeVolume) ops(pod *corev1.Pod, out []jsonpatch.Operation) []jsonpatch.Operation {
	if len(pod.Spec.Volumes) == 1 {
		return append(out, jsonpatch.Operation{Operation: "remove", Path: "/spec/volumes"})
	}
	return append(out, jsonpatch.Operation{Operation: "remove", Path: "/spec/volumes/" + strconv.Itoa(e.index)})
}

func (e removeVolume) apply(pod *corev1.Pod) {
	if pod.Spec.Volumes = slices.Delete(pod.Spec.Volumes, e.index, e.index+1); len(pod.Spec.Volumes) == 0 {
		pod.Spec.Volumes = nil
	}
}
