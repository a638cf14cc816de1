package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/layout"
)

const (
	gpuResource    = corev1.ResourceName("nvidia.com/gpu")
	legacyResource = corev1.ResourceName("alpha.kubernetes.io/nvidia-gpu")
	// injectedLibDir is where every layout of the demo puts libcuda.so.1.
	injectedLibDir = "/usr/local/nvidia/lib64"
)

// view is everything the report says about one workload's pod.
type view struct {
	w   *workload
	pod *corev1.Pod
	// node is the Node the pod is bound to, nil while unbound.
	node *corev1.Node
	rec  *layout.Injected
	// warnings are the webhook's warnings for the pod; warningsFrom says how
	// the demo knows them.
	warnings     []string
	warningsFrom string
	// warningsUnknown: the demo could not tell them.
	warningsUnknown bool
	logs            []containerLog
	schedMsg        string
	service         string
	problems        []string
}

type containerLog struct {
	container string
	text      string
}

// collect reads the current state of every workload's pod.
func (d *demo) collect(ctx context.Context, wls []*workload) ([]*view, error) {
	var views []*view
	for _, w := range wls {
		v := &view{w: w}
		views = append(views, v)
		p, err := d.pod(ctx, w)
		if err != nil || p == nil {
			v.problems = append(v.problems, fmt.Sprintf("no pod of %s %s/%s (%v)", w.kind, w.ns, w.name, err))
			continue
		}
		v.pod = p
		if p.Spec.NodeName != "" {
			n, err := d.env.Clientset.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("failed to get node %s: %w", p.Spec.NodeName, err)
			}
			v.node = n
		}
		if s, ok := p.Annotations[layout.AnnotationInjected]; ok {
			var rec layout.Injected
			if err := json.Unmarshal([]byte(s), &rec); err != nil {
				v.problems = append(v.problems, fmt.Sprintf("annotation %s does not parse: %v", layout.AnnotationInjected, err))
			} else {
				v.rec = &rec
			}
		}
		switch {
		case w.ns != nsInject:
			v.warningsFrom = "none: the namespace did not opt in, so the API server never called the webhook"
		case w.kind == "Pod":
			v.warnings = d.applied[w.ns+"/"+w.file].warnings
			v.warningsFrom = "printed by kubectl apply"
		default:
			// The API server hands admission warnings to the client that created
			// the pod: here the Job or Deployment controller, not kubectl.
			ws, err := d.mutateOffline(ctx, w.ns, w.file)
			if err != nil {
				v.warningsFrom = fmt.Sprintf("the %s controller created the pod and got them; reproducing them offline failed: %v", w.kind, err)
				v.warningsUnknown = true
				break
			}
			v.warnings = ws[w.kind+"/"+w.name]
			v.warningsFrom = fmt.Sprintf("the %s controller created the pod and got them; `gpu-injector mutate` on the manifest, offline, says", w.kind)
		}
		if ran(p) {
			for _, c := range p.Spec.Containers {
				text, err := d.logs(ctx, p, c.Name)
				if err != nil {
					text = fmt.Sprintf("(no log: %v)", err)
				}
				v.logs = append(v.logs, containerLog{container: c.Name, text: text})
			}
		}
		if w.expect == pendingForever {
			if v.schedMsg, err = d.schedulingFailure(ctx, p); err != nil {
				return nil, fmt.Errorf("failed to list events: %w", err)
			}
		}
		if w.kind == "Deployment" {
			v.service = d.describeService(ctx, w.ns, w.name)
		}
		v.problems = append(v.problems, d.check(v)...)
	}
	return views, nil
}

// ran says whether a container of the pod was started by a kubelet.
func ran(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.RestartCount > 0 {
			return true
		}
	}
	return false
}

func (d *demo) describeService(ctx context.Context, ns, name string) string {
	svc, err := d.env.Clientset.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("Service %s: %v", name, err)
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, p.Port))
	}
	slices, err := d.env.Clientset.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	var eps []string
	if err == nil {
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				for _, a := range ep.Addresses {
					for _, p := range s.Ports {
						if p.Port != nil {
							eps = append(eps, fmt.Sprintf("%s:%d", a, *p.Port))
						}
					}
				}
			}
		}
	}
	if len(eps) == 0 {
		eps = []string{"none yet"}
	}
	return fmt.Sprintf("Service %s %s -> endpoints %s (no kube-proxy runs here: reach it with kubectl port-forward)",
		name, strings.Join(ports, ","), strings.Join(eps, ","))
}

// check lists how the pod differs from what the demo shows.
func (d *demo) check(v *view) []string {
	w, p := v.w, v.pod
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if w.expect == pendingForever {
		if p.Spec.NodeName != "" {
			bad("bound to %s, want Pending", p.Spec.NodeName)
		}
		if v.rec != nil || len(hostPathVolumes(p)) > 0 {
			bad("was mutated, want it untouched")
		}
		if !strings.Contains(v.schedMsg, string(legacyResource)) {
			bad("no FailedScheduling event naming %s (got %q)", legacyResource, v.schedMsg)
		}
		return problems
	}
	if w.node == nil {
		return []string{"the environment has no node for this workload"}
	}
	if p.Spec.NodeName != w.node.Name {
		bad("bound to %q, want %s", p.Spec.NodeName, w.node.Name)
	}
	if v.rec == nil {
		bad("not mutated: no %s annotation", layout.AnnotationInjected)
	} else if v.node != nil && v.rec.Fingerprint != v.node.Labels[layout.LabelFingerprint] {
		bad("injected layout %s, but node %s publishes %s", v.rec.Fingerprint, v.node.Name, v.node.Labels[layout.LabelFingerprint])
	}
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Limits[legacyResource]; ok {
			bad("container %s still asks for %s", c.Name, legacyResource)
		}
	}
	for _, m := range hostPathMounts(p) {
		if !m.readOnly {
			bad("hostPath %s is mounted read-write", m.hostPath)
		}
	}
	all := ""
	for _, l := range v.logs {
		all += l.text
	}
	want := fmt.Sprintf("loaded libcuda.so.1 from %s/libcuda.so.1 driver=%s", injectedLibDir, w.node.DriverVersion)
	switch w.expect {
	case completes:
		if p.Status.Phase != corev1.PodSucceeded {
			bad("phase %s, want Succeeded", p.Status.Phase)
		}
		if s := "Driver Version: " + w.node.DriverVersion; !strings.Contains(all, s) {
			bad("no container said %q", s)
		}
	case serves:
		if p.Status.Phase != corev1.PodRunning {
			bad("phase %s, want Running", p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				bad("container %s restarted %d times", cs.Name, cs.RestartCount)
			}
		}
	case bound:
		if ran(p) {
			bad("it ran, on a node with no kubelet")
		}
		return problems
	}
	if !strings.Contains(all, want) {
		bad("no container said %q", want)
	}
	if !strings.Contains(all, standin.Notice) {
		bad("no container said %q", standin.Notice)
	}
	return problems
}

type mount struct {
	hostPath, mountPath, kind string
	readOnly                  bool
	containers                []string
}

func hostPathVolumes(p *corev1.Pod) map[string]*corev1.HostPathVolumeSource {
	out := map[string]*corev1.HostPathVolumeSource{}
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath
		}
	}
	return out
}

// hostPathMounts are the pod's hostPath mounts, one entry per distinct mount
// with the containers that have it.
func hostPathMounts(p *corev1.Pod) []*mount {
	vols := hostPathVolumes(p)
	byKey := map[string]*mount{}
	var out []*mount
	for _, c := range p.Spec.Containers {
		for _, vm := range c.VolumeMounts {
			hp, ok := vols[vm.Name]
			if !ok {
				continue
			}
			kind := ""
			if hp.Type != nil {
				kind = string(*hp.Type)
			}
			key := fmt.Sprintf("%s|%s|%t", hp.Path, vm.MountPath, vm.ReadOnly)
			m, ok := byKey[key]
			if !ok {
				m = &mount{hostPath: hp.Path, mountPath: vm.MountPath, kind: kind, readOnly: vm.ReadOnly}
				byKey[key] = m
				out = append(out, m)
			}
			m.containers = append(m.containers, c.Name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].mountPath < out[j].mountPath })
	return out
}

// report prints the report and returns whether any check failed.
func (d *demo) report(ctx context.Context, views []*view) bool {
	e := d.env
	d.say("")
	d.say("==================== gpu-injector demo report ====================")
	d.say("No GPU here: every node's driver is a STAND-IN (%q), whose", standin.Notice)
	d.say("libcuda, libnvidia-ml and nvidia-smi say so. Only %s runs a real kubelet.", e.KubeletNode().Name)
	d.say("")
	d.say("Simulated GPU nodes (what each node's probe published):")
	for _, n := range e.Nodes {
		d.sayNode(ctx, n)
	}
	d.say("")
	d.say("gpu-injector itself, installed with helm and run by the kubelet (kubectl get pods -n %s -o wide):", env.Namespace)
	if out, stderr, err := d.kubectl(ctx, "get", "pods", "-n", env.Namespace, "-o", "wide"); err != nil {
		d.say("  failed: %v: %s", err, strings.TrimSpace(stderr))
	} else {
		for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			d.say("  %s", l)
		}
	}
	d.say("  (the probes of %s run as local processes: those nodes have no kubelet)", apiOnlyNames(e))
	failed := false
	for _, v := range views {
		d.say("")
		d.sayView(v)
		failed = failed || len(v.problems) > 0
	}
	d.say("")
	d.say("Checks:")
	for _, v := range views {
		what := fmt.Sprintf("%s/%s %s", v.w.ns, v.w.kind, v.w.name)
		if len(v.problems) == 0 {
			d.say("  ok    %-32s %s", what, expectText(v))
			continue
		}
		d.say("  FAIL  %-32s %s", what, strings.Join(v.problems, "; "))
	}
	d.say("")
	d.say("Ready in %s (environment logs: %s).", roundSeconds(d), e.LogsDir)
	return failed
}

func expectText(v *view) string {
	switch v.w.expect {
	case completes:
		return fmt.Sprintf("ran on %s and loaded the injected stand-in driver %s", v.w.node.Name, v.w.node.DriverVersion)
	case serves:
		return fmt.Sprintf("serving on %s with the injected stand-in driver %s", v.w.node.Name, v.w.node.DriverVersion)
	case bound:
		return fmt.Sprintf("bound to %s with its layout; never runs (no kubelet)", v.w.node.Name)
	default:
		return "untouched, Pending: no node offers " + string(legacyResource)
	}
}

func roundSeconds(d *demo) string {
	return time.Since(d.start).Round(time.Second).String()
}

func (d *demo) sayNode(ctx context.Context, n *env.Node) {
	node, err := d.env.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		d.say("  %s: %v", n.Name, err)
		return
	}
	runs := "API object only, no kubelet: its pods are bound, never run"
	if n.Kubelet {
		runs = "real kubelet + containerd: its pods run"
	}
	l := node.Labels
	gpus := node.Status.Allocatable[gpuResource]
	d.say("  %-12s %s", n.Name, runs)
	d.say("  %-12s %s layout, accelerator=%s, %s GPUs allocatable, GPU product %q", "", layoutName(n.Layout), l[env.LabelAccelerator], gpus.String(), l[layout.LabelGPUProduct])
	d.say("  %-12s driver %s (stand-in), layout fingerprint %s", "", l[layout.LabelDriverVersion], l[layout.LabelFingerprint])
	plan, err := layout.Decode(node.Annotations[layout.AnnotationLayout])
	if err != nil {
		d.say("  %-12s layout annotation: %v", "", err)
		return
	}
	for _, m := range plan.Mounts {
		d.say("  %-12s   %s -> %s", "", m.HostPath, m.ContainerPath)
	}
}

// layoutName says which classic install a stand-in layout copies.
func layoutName(l standin.Layout) string {
	switch l {
	case standin.GKE:
		return "GKE (Container-Optimized OS installer)"
	case standin.UbuntuNvidia:
		return "Ubuntu nvidia-384 package"
	case standin.CentOS7:
		return "CentOS 7 NVIDIA package"
	}
	return string(l)
}

func (d *demo) sayView(v *view) {
	w, p := v.w, v.pod
	if p == nil {
		d.say("%s %s/%s: %s", w.kind, w.ns, w.name, w.title)
		d.say("  no pod: %s", strings.Join(v.problems, "; "))
		return
	}
	head := fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	if w.kind != "Pod" {
		head += fmt.Sprintf(" (of %s %s)", w.kind, w.name)
	}
	d.say("%s: %s", head, w.title)
	field := func(name, format string, args ...any) {
		d.say("  %-11s %s", name, fmt.Sprintf(format, args...))
	}
	more := func(format string, args ...any) { field("", format, args...) }

	switch {
	case v.node == nil:
		field("node", "none: %s, not scheduled", p.Status.Phase)
	default:
		kind := "API object only"
		if en := d.env.Node(v.node.Name); en != nil && en.Kubelet {
			kind = "real kubelet"
		}
		field("node", "%s (%s), layout %s, driver %s (stand-in)", v.node.Name, kind,
			v.node.Labels[layout.LabelFingerprint], v.node.Labels[layout.LabelDriverVersion])
		if w.expect == bound && !ran(p) {
			field("status", "%s: bound, and no kubelet will ever start it", p.Status.Phase)
		} else {
			field("status", "%s", statusText(p))
		}
	}
	var limits []string
	for _, c := range p.Spec.Containers {
		for _, r := range []corev1.ResourceName{gpuResource, legacyResource} {
			if q, ok := c.Resources.Limits[r]; ok {
				limits = append(limits, fmt.Sprintf("%s %s=%s", c.Name, r, q.String()))
			}
		}
	}
	field("GPU limits", "%s", strings.Join(limits, ", "))

	if v.rec == nil {
		if w.ns == nsInject {
			field("injected", "nothing")
		} else {
			field("injected", "nothing: namespace %s has no %s=%s label", w.ns, layout.LabelInject, layout.InjectEnabled)
		}
	} else {
		first := true
		line := func(format string, args ...any) {
			if first {
				field("injected", format, args...)
				first = false
				return
			}
			more(format, args...)
		}
		for _, m := range hostPathMounts(p) {
			ro := "read-write!"
			if m.readOnly {
				ro = "ro"
			}
			line("hostPath %s -> %s (%s, %s) in %s", m.hostPath, m.mountPath, ro, m.kind, strings.Join(m.containers, ", "))
		}
		for _, g := range envGroups(p, "LD_LIBRARY_PATH") {
			line("%s", g)
		}
		if fp, ok := p.Spec.NodeSelector[layout.LabelFingerprint]; ok {
			line("nodeSelector %s=%s", layout.LabelFingerprint, fp)
		}
		line("annotation %s=%s", layout.AnnotationInjected, v.rec.String())
	}

	if w.ns == nsInject {
		field("warnings", "(%s)", v.warningsFrom)
		if len(v.warnings) == 0 && !v.warningsUnknown {
			more("none")
		}
		for _, wn := range v.warnings {
			more("- %s", wn)
		}
	} else {
		field("warnings", "%s", v.warningsFrom)
	}
	if v.schedMsg != "" {
		field("scheduler", "%s", v.schedMsg)
	}
	if v.service != "" {
		field("service", "%s", v.service)
	}

	switch {
	case len(v.logs) > 0:
		field("saw", "(container logs)")
		for _, l := range v.logs {
			lines := nonEmptyLines(l.text)
			if len(lines) == 0 {
				lines = []string{"(empty)"}
			}
			for _, ln := range lines {
				more("%s | %s", l.container, ln)
			}
		}
	case w.expect == bound && v.node != nil:
		field("saw", "nothing: %s is an API object with no kubelet, so the pod is bound there and never runs", v.node.Name)
	case w.expect == pendingForever:
		field("saw", "nothing: it never starts")
	}
}

func statusText(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil:
			s += fmt.Sprintf(", %s exited %d", cs.Name, cs.State.Terminated.ExitCode)
		case cs.State.Running != nil:
			s += fmt.Sprintf(", %s running", cs.Name)
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			s += fmt.Sprintf(", %s %s", cs.Name, cs.State.Waiting.Reason)
		}
		if cs.RestartCount > 0 {
			s += fmt.Sprintf(" (%d restarts)", cs.RestartCount)
		}
	}
	return s
}

// envGroups renders an environment variable of the pod's containers, one
// line per distinct value, naming the containers that have it.
func envGroups(p *corev1.Pod, name string) []string {
	byValue := map[string][]string{}
	var order []string
	for _, c := range p.Spec.Containers {
		for _, ev := range c.Env {
			if ev.Name != name {
				continue
			}
			if _, ok := byValue[ev.Value]; !ok {
				order = append(order, ev.Value)
			}
			byValue[ev.Value] = append(byValue[ev.Value], c.Name)
		}
	}
	var out []string
	for _, val := range order {
		out = append(out, fmt.Sprintf("%s=%s in %s", name, val, strings.Join(byValue[val], ", ")))
	}
	return out
}

// howTo says how to look around, and how to stop.
func (d *demo) howTo() {
	e := d.env
	if d.exit {
		d.say("--exit: tearing everything down now.")
		return
	}
	d.say("")
	d.say("Poke at it (from another terminal):")
	d.say("  export KUBECONFIG=%s", e.Kubeconfig)
	d.say("  export PATH=%s:$PATH", filepath.Dir(e.Kubectl))
	d.say("  kubectl get nodes -L %s,%s,%s", layout.LabelFingerprint, layout.LabelDriverVersion, env.LabelAccelerator)
	d.say("  kubectl get pods -A -o wide")
	d.say("  kubectl -n %s get pod -l batch.kubernetes.io/job-name=nvidia-smi -o yaml   # what the webhook injected", nsInject)
	d.say("  kubectl -n %s logs job/nvidia-smi -c nvidia-smi", nsInject)
	d.say("  kubectl -n %s port-forward svc/tensorflow-style 8888:8888 &  curl -s localhost:8888", nsInject)
	d.say("  kubectl -n %s describe pod -l batch.kubernetes.io/job-name=nvidia-smi   # Pending: Insufficient %s", nsUnlabelled, legacyResource)
	d.say("  sed s/cuda-check-p100/try-me/ hack/demo/manifests/cuda-check-p100.yaml | kubectl -n %s create --dry-run=server -o yaml -f -   # the mutation, nothing created", nsInject)
	d.say("  %s mutate -f hack/demo/manifests/tensorflow-style.yaml --nodes <(kubectl get nodes -o yaml) --config %s", e.Binary, e.ConfigFile)
	d.say("  kubectl -n %s logs deploy/%s   # the webhook", env.Namespace, env.WebhookDeployment)
	d.say("Logs: %s (nodeprobe-<node>.log of the API-only nodes, cluster/<component>.log; pods/ after teardown)", e.LogsDir)
}

// apiOnlyNames lists the nodes without a kubelet.
func apiOnlyNames(e *env.Env) string {
	var names []string
	for _, n := range e.Nodes {
		if !n.Kubelet {
			names = append(names, n.Name)
		}
	}
	return strings.Join(names, ", ")
}
