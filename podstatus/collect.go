package podstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// ErrNotFound: the pod does not exist and no manifest stands in for it.
var ErrNotFound = errors.New("pod not found")

// Collector reads one pod and what decides its driver, from the API server
// of Client, or from Files without any API server.
type Collector struct {
	Client kubernetes.Interface
	// Namespace is where gpu-injector runs; empty finds it by the chart's
	// labels, as `status` does.
	Namespace string
	// Manifest stands in for a pod the API server does not have (the webhook
	// refused it): its spec is decided as the webhook would now.
	Manifest *corev1.Pod
	// Files, when set, stand in for the API server: the pod, its node and
	// the cluster the decision reads are theirs, and Client is not used.
	Files *Files
	// Images, when set, give the images' configuration to the decision.
	Images admitinput.ImageReader
	// Clock ages the pool memory's entries; nil is the real clock.
	Clock clock.PassiveClock
}

func (c *Collector) source() source {
	if c.Files != nil {
		return fileSource{files: c.Files}
	}
	return apiSource{client: c.Client, namespace: c.Namespace}
}

// Collect reads the pod namespace/name.
func (c *Collector) Collect(ctx context.Context, namespace, name string) (*Report, error) {
	src := c.source()
	rel, err := src.release(ctx)
	if err != nil {
		return nil, err
	}
	r := &Report{Pod: namespace + "/" + name, Attention: []string{}}
	pod, err := c.pod(ctx, src, namespace, name, r)
	if err != nil {
		return nil, err
	}
	readRecord(pod, r)
	readContainers(pod, r)
	r.Scheduling = schedulingMessage(pod)
	if r.Node != "" {
		node, err := src.node(ctx, r.Node)
		switch {
		case err != nil:
			return nil, err
		case node == nil:
			r.attention("%s", src.missing(r.Node))
		default:
			r.NodeLayout = nodeLayout(node, r)
			r.StaleDriver = staleDriver(node, r.Pod)
		}
	}
	if r.StaleDriver == "" {
		r.StaleDriver = "unknown: the pod runs on no node"
	}
	if r.Phase == phaseNotCreated || r.Phase == string(corev1.PodPending) || refused(r) {
		adm, err := c.decide(ctx, src, rel, pod, r)
		if err != nil {
			return nil, err
		}
		r.Admission = adm
	}
	r.summarize()
	return r, nil
}

// phaseNotCreated is the phase of a pod no API server stored: a manifest.
const phaseNotCreated = "NotCreated"

// pod reads the pod and its phase and node; a pod the source does not have
// is the manifest, if one stands in for it, and a pod without a status (a
// manifest in the files) is one not created.
func (c *Collector) pod(ctx context.Context, src source, namespace, name string, r *Report) (*corev1.Pod, error) {
	pod, err := src.pod(ctx, namespace, name)
	switch {
	case err != nil:
		return nil, err
	case pod == nil && c.Manifest != nil:
		pod = c.Manifest.DeepCopy()
		pod.Namespace, pod.Name = namespace, name
		r.Phase = phaseNotCreated
	case pod == nil && c.Files != nil:
		return nil, fmt.Errorf("%w: %s/%s is in none of the pods of %s", ErrNotFound, namespace, name, c.Files.Name)
	case pod == nil:
		return nil, fmt.Errorf("%w: %s/%s; for a pod the webhook refused, pass its manifest with --manifest to see why, or with -f and the cluster's files to see it offline", ErrNotFound, namespace, name)
	case pod.Status.Phase == "":
		r.Phase = phaseNotCreated
	default:
		r.Phase = string(pod.Status.Phase)
		r.Node = pod.Spec.NodeName
	}
	return pod, nil
}

func (r *Report) attention(format string, args ...any) {
	r.Attention = append(r.Attention, fmt.Sprintf(format, args...))
}

// readRecord reads what the webhook wrote on the pod.
func readRecord(pod *corev1.Pod, r *Report) {
	if v, ok := pod.Annotations[layout.AnnotationImagesUnread]; ok {
		if rec, err := layout.DecodeImagesUnread(v); err == nil {
			r.ImagesUnread = rec.Images
		} else {
			r.ImagesUnreadNote = layout.OneLine(err.Error(), 200)
		}
	}
	if v, ok := pod.Annotations[layout.AnnotationRuntimeInject]; ok {
		if names, err := layout.ParseRuntimeMarker(v); err == nil {
			r.RuntimeMarker = names
		}
	}
	v, ok := pod.Annotations[layout.AnnotationInjected]
	if !ok {
		r.Delivery = DeliveryNone
		r.RecordNote = "no " + layout.AnnotationInjected + " annotation: the webhook did not change this pod"
		return
	}
	rec, err := layout.ParseInjected(v)
	if err != nil {
		r.Delivery = DeliveryNone
		r.RecordNote = err.Error()
		return
	}
	r.Record = &rec
	switch {
	case rec.Runtime == layout.InjectedByNRI:
		r.Delivery = DeliveryNRI
	case len(rec.Volumes) > 0:
		r.Delivery = DeliveryHostPath
	default:
		r.Delivery = DeliveryNodeRuntime
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && slices.Contains(rec.Volumes, v.Name) {
			r.HostPaths = append(r.HostPaths, v.HostPath.Path)
		}
	}
}

// readContainers lists the GPU containers the record or the marker names,
// and every container waiting on an error, with the runtime's message.
func readContainers(pod *corev1.Pod, r *Report) {
	gpu := map[string]bool{}
	if r.Record != nil {
		for _, n := range r.Record.Containers {
			gpu[n] = true
		}
	}
	for _, n := range r.RuntimeMarker {
		gpu[n] = true
	}
	statuses := map[string]corev1.ContainerStatus{}
	for _, s := range pod.Status.ContainerStatuses {
		statuses[s.Name] = s
	}
	for _, ctr := range pod.Spec.Containers {
		s, seen := statuses[ctr.Name]
		c := Container{Name: ctr.Name, GPU: gpu[ctr.Name], State: "not created"}
		switch {
		case !seen:
		case s.State.Running != nil:
			c.State = "running"
		case s.State.Terminated != nil:
			c.State, c.Reason, c.Message = "terminated", s.State.Terminated.Reason, s.State.Terminated.Message
		case s.State.Waiting != nil:
			c.State, c.Reason, c.Message = "waiting", s.State.Waiting.Reason, s.State.Waiting.Message
			// The runtime passes the plugin's error on as the container's
			// creation error; the plugin's every refusal starts so.
			c.RefusedByPlugin = strings.HasPrefix(c.Reason, "CreateContainer") && strings.Contains(c.Message, "gpu-injector: ")
		}
		if c.GPU || c.RefusedByPlugin || c.State == "waiting" && strings.HasSuffix(c.Reason, "Error") {
			r.Containers = append(r.Containers, c)
		}
	}
}

func refused(r *Report) bool {
	return slices.ContainsFunc(r.Containers, func(c Container) bool { return c.RefusedByPlugin })
}

func schedulingMessage(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return ""
}

// nodeLayout reads the pod's node as its probe publishes it now, and whether
// it still has what the pod got.
func nodeLayout(n *corev1.Node, r *Report) *NodeLayout {
	nl := &NodeLayout{Name: n.Name, State: n.Labels[layout.LabelState], Reason: status.StateReason(n.Annotations),
		Fingerprint: n.Labels[layout.LabelFingerprint], DriverVersion: n.Labels[layout.LabelDriverVersion], NRIPlugin: n.Labels[layout.LabelNRIPlugin]}
	if v, ok := n.Annotations[layout.AnnotationLayout]; ok {
		if plan, err := layout.Decode(v); err == nil {
			nl.Runtime = plan.RuntimeInjection
		}
	}
	switch {
	case nl.NRIPlugin == layout.NRIProtocol:
		nl.Plugin = "registered with the node's container runtime"
	case nl.NRIPlugin != "":
		nl.Plugin = fmt.Sprintf("registered, serving marker protocol %q, not this release's %q", nl.NRIPlugin, layout.NRIProtocol)
	default:
		nl.Plugin = "not registered (no " + layout.LabelNRIPlugin + " label)"
	}
	rec := r.Record
	switch {
	case rec == nil:
		nl.StillHas = true
	case r.Delivery == DeliveryNRI:
		// The plugin mounts what the node has when the container is created.
		nl.StillHas = nl.NRIPlugin == layout.NRIProtocol && nl.State == layout.StateReady
		if !nl.StillHas {
			nl.Note = "the node's plugin is " + nl.Plugin + ", its state " + dash(nl.State)
		}
	case rec.StaticLayout != "":
		nl.StillHas = true
		nl.Note = "static layout " + rec.StaticLayout + ": the node publishes nothing to compare"
	default:
		nl.StillHas = nl.Fingerprint == rec.Fingerprint && nl.State == layout.StateReady
		if !nl.StillHas {
			nl.Note = fmt.Sprintf("the pod got layout %s (driver %s); the node now has %s (driver %s), state %s",
				rec.Fingerprint, dash(rec.DriverVersion), dash(nl.Fingerprint), dash(nl.DriverVersion), dash(nl.State))
		}
	}
	return nl
}

// staleDriver says whether the node's NRI plugin found the pod on a deleted
// driver (the probe's gpu-injector.io/stale-driver annotation).
func staleDriver(n *corev1.Node, pod string) string {
	v, ok := n.Annotations[layout.AnnotationStaleDriver]
	if !ok {
		if n.Labels[layout.LabelNRIPlugin] == "" {
			return "unknown: no gpu-injector NRI plugin is registered on the node to look"
		}
		return "unknown: the node's NRI plugin does not scan (runtimeInjection.staleDriver.enabled=false)"
	}
	s, err := layout.DecodeStaleDriver(v)
	switch {
	case err != nil:
		return "unknown: " + err.Error()
	case slices.Contains(s.Pods, pod):
		return "yes: it maps driver libraries deleted since it started; restart it"
	case s.StalePods > len(s.Pods):
		return fmt.Sprintf("unknown: the node names %d of its %d pods on a deleted driver, not this one", len(s.Pods), s.StalePods)
	case s.Unreadable > 0:
		return fmt.Sprintf("unknown: the node's plugin may not read %d GPU containers' maps", s.Unreadable)
	}
	return "no (the node's scan has said the same since " + s.CheckedAt.UTC().Format("2006-01-02T15:04:05Z") + ")"
}

// decide runs the webhook's decision on the pod as it was before the webhook
// changed it, through the webhook's builder of its input, over the cluster
// as the source reads it now.
func (c *Collector) decide(ctx context.Context, src source, rel status.Release, pod *corev1.Pod, r *Report) (*Admission, error) {
	clk := c.Clock
	if clk == nil {
		clk = wallclock.Real()
	}
	input, notes, err := builder(ctx, src, rel, pod, c.Images, clk)
	if err != nil {
		return nil, err
	}
	res := input.Decide(ctx, asSubmitted(pod, r.Record), pod.Namespace, pod.UID)
	a := &Admission{Decision: string(res.Decision), Reason: res.Reason, Warnings: res.Warnings}
	if res.Layout != nil {
		a.Runtime = res.Layout.Runtime
		a.Fingerprint = res.Layout.Fingerprint
		a.DriverVersion = res.Layout.Plan.DriverVersion
	}
	if rel.Note != "" {
		notes = append([]string{rel.Note}, notes...)
	}
	a.Note = strings.Join(notes, "; ")
	return a, nil
}

// asSubmitted is the pod as its author wrote it, as far as the record tells:
// without the webhook's record, marker, volumes, mounts and pin, and
// without the node the scheduler gave it.
func asSubmitted(pod *corev1.Pod, rec *layout.Injected) *corev1.Pod {
	p := pod.DeepCopy()
	p.ManagedFields, p.Status = nil, corev1.PodStatus{}
	p.ResourceVersion, p.Generation = "", 0
	if scheduled(pod) {
		p.Spec.NodeName = ""
	}
	if rec == nil {
		return p
	}
	delete(p.Annotations, layout.AnnotationInjected)
	delete(p.Annotations, layout.AnnotationRuntimeInject)
	for k := range p.Annotations {
		if k == layout.AnnotationNRIRequiredPlugins || strings.HasPrefix(k, layout.AnnotationNRIRequiredPlugins+"/") {
			delete(p.Annotations, k)
		}
	}
	delete(p.Labels, layout.LabelPinnedLayout)
	delete(p.Annotations, layout.AnnotationImagesUnread)
	delete(p.Labels, layout.LabelImagesUnread)
	if p.Spec.NodeSelector[layout.LabelFingerprint] == rec.Fingerprint {
		delete(p.Spec.NodeSelector, layout.LabelFingerprint)
	}
	p.Spec.Volumes = slices.DeleteFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return slices.Contains(rec.Volumes, v.Name) })
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range list {
			list[i].VolumeMounts = slices.DeleteFunc(list[i].VolumeMounts, func(m corev1.VolumeMount) bool { return slices.Contains(rec.Volumes, m.Name) })
		}
	}
	return p
}

// scheduled says whether the scheduler bound the pod: its nodeName was not
// the author's.
func scheduled(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// summarize lists what needs someone.
func (r *Report) summarize() {
	for _, c := range r.Containers {
		if c.RefusedByPlugin {
			r.attention("container %s was refused at creation by the node's gpu-injector NRI plugin: %s", c.Name, c.Message)
		}
	}
	if nl := r.NodeLayout; nl != nil && !nl.StillHas {
		r.attention("its node no longer has what the pod got: %s", nl.Note)
	}
	if strings.HasPrefix(r.StaleDriver, "yes") {
		r.attention("it runs a driver deleted from its node since it started (a driver upgrade): restart it")
	}
	if r.Phase == string(corev1.PodPending) && r.Scheduling != "" {
		r.attention("not scheduled: %s", r.Scheduling)
	}
	if a := r.Admission; a != nil && a.Decision == string(inject.DecisionDenied) {
		r.attention("the webhook would refuse it now: %s", a.Reason)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
