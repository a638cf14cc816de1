package podstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// ErrNotFound: the pod does not exist and no manifest stands in for it.
var ErrNotFound = errors.New("pod not found")

// Collector reads one pod and what decides its driver.
type Collector struct {
	Client kubernetes.Interface
	// Namespace is where gpu-injector runs; empty finds it by the chart's
	// labels, as `status` does.
	Namespace string
	// Manifest stands in for a pod the API server does not have (the webhook
	// refused it): its spec is decided as the webhook would now.
	Manifest *corev1.Pod
}

// Collect reads the pod namespace/name.
func (c *Collector) Collect(ctx context.Context, namespace, name string) (*Report, error) {
	cfg, _, cfgNote, err := (&status.Collector{Client: c.Client, Namespace: c.Namespace}).Config(ctx)
	if err != nil {
		return nil, err
	}
	r := &Report{Pod: namespace + "/" + name, Attention: []string{}}
	pod, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && c.Manifest != nil:
		pod = c.Manifest.DeepCopy()
		pod.Namespace, pod.Name = namespace, name
		r.Phase = "NotCreated"
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: %s/%s; for a pod the webhook refused, pass its manifest with -f to see why", ErrNotFound, namespace, name)
	case err != nil:
		return nil, fmt.Errorf("failed to get pod %s/%s: %w", namespace, name, err)
	default:
		r.Phase = string(pod.Status.Phase)
		r.Node = pod.Spec.NodeName
	}

	readRecord(pod, r)
	readContainers(pod, r)
	r.Scheduling = schedulingMessage(pod)
	if r.Node != "" {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			r.attention("its node %s no longer exists", r.Node)
		case err != nil:
			return nil, fmt.Errorf("failed to get node %s: %w", r.Node, err)
		default:
			r.NodeLayout = nodeLayout(node, r)
			r.StaleDriver = staleDriver(node, r.Pod)
		}
	}
	if r.StaleDriver == "" {
		r.StaleDriver = "unknown: the pod runs on no node"
	}
	if r.Phase == "NotCreated" || r.Phase == string(corev1.PodPending) || refused(r) {
		adm, err := c.decide(ctx, cfg, cfgNote, pod, r)
		if err != nil {
			return nil, err
		}
		r.Admission = adm
	}
	r.summarize()
	return r, nil
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

// decide runs the webhook's mutation on the pod as it was before the webhook
// changed it, against every node as the webhook's index reads them now.
func (c *Collector) decide(ctx context.Context, cfg *config.Configuration, cfgNote string, pod *corev1.Pod, r *Report) (*Admission, error) {
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to list nodes: %w", err)
	}
	idx := gpunodes.NewIndex(cfg, logr.Discard())
	for i := range nodes.Items {
		idx.Update(&nodes.Items[i])
	}
	var nsLabels map[string]string
	if ns, err := c.Client.CoreV1().Namespaces().Get(ctx, pod.Namespace, metav1.GetOptions{}); err == nil {
		nsLabels = ns.Labels
	} else if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("failed to get namespace %s: %w", pod.Namespace, err)
	}
	fresh := asSubmitted(pod, r.Record)
	res := inject.Mutate(inject.Input{Pod: fresh, NamespaceLabels: nsLabels, Layouts: idx.Layouts(), Wedged: idx.Wedged(),
		Seed: inject.Seed(string(pod.UID))}, cfg)
	a := &Admission{Decision: string(res.Decision), Reason: res.Reason, Warnings: res.Warnings}
	if res.Layout != nil {
		a.Runtime = res.Layout.Runtime
		a.Fingerprint = res.Layout.Fingerprint
		a.DriverVersion = res.Layout.Plan.DriverVersion
	}
	var notes []string
	if cfgNote != "" {
		notes = append(notes, cfgNote)
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		notes = append(notes, "the pod's resource claims (DRA) are not read here")
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
