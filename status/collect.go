package status

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

// The chart's labels: every install has them, whatever its release name.
const (
	chartName         = "gpu-injector"
	webhookSelector   = "app.kubernetes.io/name=" + chartName + ",app.kubernetes.io/component=webhook"
	probeSelector     = "app.kubernetes.io/name=" + chartName + ",app.kubernetes.io/component=nodeprobe"
	configSelector    = "app.kubernetes.io/name=" + chartName
	configurationName = "gpu-injector"
	// defaultPoolMemory is the webhook's --pool-memory-name default.
	defaultPoolMemory = "gpu-injector-pools"
	configKey         = "config.yaml"
	// The label Pod Security admission reads on a Namespace.
	labelEnforce = "pod-security.kubernetes.io/enforce"
	// eventWindow is how far back LayoutMismatch Events count.
	eventWindow = time.Hour
	// dryRunImage is never pulled: a dry run stores nothing and starts nothing.
	dryRunImage = "registry.k8s.io/pause:3.10"
	// refusedMessage is what a flagged namespace says.
	refusedMessage = "GPU pods will be refused: hostPath is forbidden at this level and no node injects at the runtime"
)

// DryRunner creates a pod with server-side dry run and returns what the API
// server would have stored, with its warnings. A fake clientset cannot run
// admission, so the tests replace it.
type DryRunner interface {
	DryRunPod(ctx context.Context, namespace string, pod *corev1.Pod) (*corev1.Pod, []string, error)
}

// Collector reads the cluster.
type Collector struct {
	Client kubernetes.Interface
	DryRun DryRunner
	// Namespace is where gpu-injector runs; empty finds it by the chart's labels.
	Namespace string
	// DryRunNamespace is where the GPU pod is tried; empty picks an opted-in
	// namespace.
	DryRunNamespace string
	// Now is the clock; nil means the real one.
	Now func() time.Time
	// RetryEvery is how often a dry run refused for a missing ServiceAccount
	// is tried again; zero means 500 ms.
	RetryEvery time.Duration
}

func (c *Collector) retryEvery() time.Duration {
	if c.RetryEvery == 0 {
		return 500 * time.Millisecond
	}
	return c.RetryEvery
}

// Collect reads everything the report shows. An error means the cluster could
// not be read; what needs attention is in Report.Attention.
func (c *Collector) Collect(ctx context.Context) (*Report, error) {
	now := wallclock.Real().Now
	if c.Now != nil {
		now = c.Now
	}
	r := &Report{Nodes: []NodeStatus{}, Namespaces: []NamespaceStatus{}, Events: []EventStatus{}, Attention: []string{}}
	dep, err := c.findWebhook(ctx)
	if err != nil {
		return nil, err
	}
	ns := c.Namespace
	args := map[string]string{}
	configMap := ""
	if dep != nil {
		ns = dep.Namespace
		args, configMap = deploymentArgs(dep)
		readDeployment(dep, &r.Webhook)
	}
	cfg, cfgNote := c.readConfig(ctx, ns, configMap)

	mwc, err := c.findConfiguration(ctx, args["--webhook-configuration-name"])
	if err != nil {
		return nil, err
	}
	external := mwc != nil && readConfiguration(mwc, &r.Webhook)

	if err := c.readProbe(ctx, ns, &r.Probe); err != nil {
		return nil, err
	}
	if err := c.readNodes(ctx, cfg, r); err != nil {
		return nil, err
	}
	readPlugin(cfg, r)
	if err := c.readNamespaces(ctx, cfg, ns, r); err != nil {
		return nil, err
	}
	poolMemory := defaultPoolMemory
	if v, ok := args["--pool-memory-name"]; ok {
		poolMemory = v
	}
	if err := c.readPools(ctx, cfg, cfgNote, ns, poolMemory, now(), &r.Pools); err != nil {
		return nil, err
	}
	if err := c.readEvents(ctx, now(), r); err != nil {
		return nil, err
	}
	c.readImagesUnread(ctx, &r.ImagesUnread)
	r.Webhook.DryRun = c.TryPod(ctx, r.Namespaces)

	r.collectAttention(dep, mwc, external)
	return r, nil
}

// readDeployment fills the webhook's status from its Deployment.
func readDeployment(dep *appsv1.Deployment, wh *WebhookStatus) {
	wh.Namespace, wh.Deployment = dep.Namespace, dep.Name
	wh.Desired = 1
	if dep.Spec.Replicas != nil {
		wh.Desired = *dep.Spec.Replicas
	}
	wh.Ready = dep.Status.ReadyReplicas
}

// readConfiguration fills the webhook's status from its
// MutatingWebhookConfiguration, and reports whether it sends pods to a URL:
// a webhook reached that way, not through a Service, has no Deployment of
// ours to find.
func readConfiguration(mwc *admissionregistrationv1.MutatingWebhookConfiguration, wh *WebhookStatus) (external bool) {
	wh.Configuration = mwc.Name
	wh.CABundle = len(mwc.Webhooks) > 0
	for _, w := range mwc.Webhooks {
		if w.FailurePolicy != nil {
			wh.FailurePolicy = string(*w.FailurePolicy)
		}
		if len(w.ClientConfig.CABundle) == 0 {
			wh.CABundle = false
		}
		if w.ClientConfig.URL != nil {
			external = true
		}
	}
	return external
}

// collectAttention lists what needs an operator, in the order the report
// prints it.
func (r *Report) collectAttention(dep *appsv1.Deployment, mwc *admissionregistrationv1.MutatingWebhookConfiguration, external bool) {
	switch {
	case dep == nil && !external:
		r.attention("no gpu-injector webhook Deployment found (labels %s)", webhookSelector)
	case dep != nil && r.Webhook.Ready == 0:
		r.attention("webhook %s/%s has 0 ready replicas (%d desired)", dep.Namespace, dep.Name, r.Webhook.Desired)
	}
	if mwc == nil {
		r.attention("no MutatingWebhookConfiguration of gpu-injector: the API server sends it no pod")
	} else if !r.Webhook.CABundle {
		r.attention("MutatingWebhookConfiguration %s has no CA bundle: the API server cannot verify the webhook", mwc.Name)
	}
	switch d := r.Webhook.DryRun; d.Outcome {
	case DryRunUnreachable:
		r.attention("the API server cannot reach the webhook: %s", d.Message)
	case DryRunDenied:
		r.attention("a GPU pod in %s is denied: %s", d.Namespace, d.Message)
	case DryRunUnchanged:
		r.attention("a GPU pod in %s was admitted without injection", d.Namespace)
	}
	if r.Probe.DaemonSet != "" && r.Probe.Ready < r.Probe.Desired {
		r.attention("probe DaemonSet %s/%s: %d of %d pods ready", r.Probe.Namespace, r.Probe.DaemonSet, r.Probe.Ready, r.Probe.Desired)
	}
	for _, n := range r.Nodes {
		if why := nodeAttention(n); why != "" {
			r.attention("node %s: %s", n.Name, why)
		}
	}
	r.pluginAttention()
	r.staleDriverAttention()
	for _, n := range r.Namespaces {
		if n.Refused != "" {
			r.attention("namespace %s enforces Pod Security %q: %s", n.Name, n.Enforce, n.Refused)
		}
	}
	if len(r.Events) > 0 {
		r.attention("%d LayoutMismatch Events in the last hour: pods landed on a node with another driver layout", len(r.Events))
	}
}

func (r *Report) attention(format string, args ...any) {
	r.Attention = append(r.Attention, fmt.Sprintf(format, args...))
}

// nodeAttention says why a GPU node needs an operator, or "".
func nodeAttention(n NodeStatus) string {
	switch {
	case n.State == layout.StateError:
		return "probe state error: " + n.Reason
	case n.State == layout.StateWedged:
		return "driver wedged (only a GPU reset or a reboot helps): " + n.Reason
	case n.State == "" && n.GPUs > 0:
		return fmt.Sprintf("advertises %d GPUs but no probe published a state", n.GPUs)
	case n.State == layout.StateNoDriver && n.GPUs > 0:
		return fmt.Sprintf("advertises %d GPUs but its probe found no driver", n.GPUs)
	}
	return ""
}

func (c *Collector) findWebhook(ctx context.Context) (*appsv1.Deployment, error) {
	list, err := c.Client.AppsV1().Deployments(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: webhookSelector})
	if err != nil {
		return nil, fmt.Errorf("failed to list the webhook Deployments: %w", err)
	}
	switch len(list.Items) {
	case 0:
		return nil, nil
	case 1:
		return &list.Items[0], nil
	}
	var where []string
	for _, d := range list.Items {
		where = append(where, d.Namespace+"/"+d.Name)
	}
	sort.Strings(where)
	return nil, fmt.Errorf("failed to choose a webhook: found %s; pass --namespace", strings.Join(where, ", "))
}

// deploymentArgs reads the webhook container's --flag=value arguments and
// the ConfigMap mounted as its configuration, so that the report follows
// whatever names the release chose.
func deploymentArgs(d *appsv1.Deployment) (map[string]string, string) {
	args := map[string]string{}
	spec := d.Spec.Template.Spec
	for _, ctr := range spec.Containers {
		if ctr.Name != "webhook" && len(spec.Containers) > 1 {
			continue
		}
		for _, a := range ctr.Args {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
				args[k] = v
			}
		}
	}
	configMap := ""
	for _, v := range spec.Volumes {
		if v.Name == "config" && v.ConfigMap != nil {
			configMap = v.ConfigMap.Name
		}
	}
	return args, configMap
}

// readConfig reads the release's configuration, which decides the GPU
// resource names, the excluded namespaces and the pool labels; the defaults
// stand in (with a note) when it cannot be read.
func (c *Collector) readConfig(ctx context.Context, ns, name string) (*config.Configuration, string) {
	if ns == "" {
		return config.Default(), "the webhook's namespace is unknown: defaults assumed"
	}
	var cm *corev1.ConfigMap
	if name != "" {
		got, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return config.Default(), fmt.Sprintf("failed to read ConfigMap %s/%s: %v; defaults assumed", ns, name, err)
		}
		cm = got
	} else {
		list, err := c.Client.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: configSelector})
		if err != nil {
			return config.Default(), fmt.Sprintf("failed to list ConfigMaps in %s: %v; defaults assumed", ns, err)
		}
		for i := range list.Items {
			if _, ok := list.Items[i].Data[configKey]; ok {
				cm = &list.Items[i]
				break
			}
		}
		if cm == nil {
			return config.Default(), "no configuration ConfigMap found: defaults assumed"
		}
	}
	cfg, err := config.Parse([]byte(cm.Data[configKey]))
	if err != nil {
		return config.Default(), fmt.Sprintf("failed to read the configuration of ConfigMap %s/%s: %v; defaults assumed", ns, cm.Name, err)
	}
	return cfg, ""
}

func (c *Collector) findConfiguration(ctx context.Context, name string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	api := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if name == "" {
		list, err := api.List(ctx, metav1.ListOptions{LabelSelector: configSelector})
		if err != nil {
			return nil, fmt.Errorf("failed to list MutatingWebhookConfigurations: %w", err)
		}
		if len(list.Items) > 0 {
			sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
			return &list.Items[0], nil
		}
		name = configurationName
	}
	mwc, err := api.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("failed to read MutatingWebhookConfiguration %s: %w", name, err)
	}
	return mwc, nil
}

func (c *Collector) readProbe(ctx context.Context, ns string, out *ProbeStatus) error {
	list, err := c.Client.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: probeSelector})
	if err != nil {
		return fmt.Errorf("failed to list the probe DaemonSets: %w", err)
	}
	if len(list.Items) == 0 {
		return nil
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].Namespace+"/"+list.Items[i].Name < list.Items[j].Namespace+"/"+list.Items[j].Name
	})
	ds := list.Items[0]
	*out = ProbeStatus{Namespace: ds.Namespace, DaemonSet: ds.Name, Desired: ds.Status.DesiredNumberScheduled,
		Ready: ds.Status.NumberReady, Available: ds.Status.NumberAvailable}
	return nil
}

func (c *Collector) readNodes(ctx context.Context, cfg *config.Configuration, r *Report) error {
	list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("failed to list nodes: %w", err)
	}
	for i := range list.Items {
		ns, ok := NodeStatusOf(&list.Items[i], cfg)
		if !ok {
			continue
		}
		c.confirmStalePods(ctx, &ns)
		r.Nodes = append(r.Nodes, ns)
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	return nil
}

// NodeStatusOf is the GPU NODES row of a Node, as its probe published it,
// and false for a node with no layout, no probe state and no GPU capacity
// of cfg's resources. The stale driver record's pods are as the node names
// them: Collect keeps only those that run there.
func NodeStatusOf(n *corev1.Node, cfg *config.Configuration) (NodeStatus, bool) {
	var gpus int64
	for name, q := range n.Status.Capacity {
		if cfg.IsGPUResource(string(name)) {
			gpus += q.Value()
		}
	}
	_, hasLayout := n.Annotations[layout.AnnotationLayout]
	state, hasState := n.Labels[layout.LabelState]
	_, hasFP := n.Labels[layout.LabelFingerprint]
	if !hasLayout && !hasState && !hasFP && gpus == 0 {
		return NodeStatus{}, false
	}
	ns := NodeStatus{Name: n.Name, State: state, GPUs: gpus, Unschedulable: n.Spec.Unschedulable,
		Reason:        StateReason(n.Annotations),
		DriverVersion: n.Labels[layout.LabelDriverVersion], Fingerprint: n.Labels[layout.LabelFingerprint],
		NRIPlugin: n.Labels[layout.LabelNRIPlugin], DriverMounts: n.Labels[layout.LabelDriverMounts]}
	if hasLayout {
		if plan, err := layout.Decode(n.Annotations[layout.AnnotationLayout]); err == nil {
			ns.Runtime = plan.RuntimeInjection
		}
	}
	readStaleDriver(&ns, n.Annotations)
	return ns, true
}

// runtimeInjects says whether some ready GPU node puts the driver in at the
// runtime, so that a GPU pod needs no hostPath.
func runtimeInjects(nodes []NodeStatus) bool {
	for _, n := range nodes {
		if n.NRIPlugin != "" || (n.State == layout.StateReady && n.Runtime != "") {
			return true
		}
	}
	return false
}

func (c *Collector) readNamespaces(ctx context.Context, cfg *config.Configuration, own string, r *Report) error {
	sel := layout.LabelInject + "=" + layout.InjectEnabled
	list, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("failed to list namespaces: %w", err)
	}
	// With no GPU node yet (every pool at zero), the webhook marks a GPU pod
	// for the runtime of the node that will take it, which needs no hostPath.
	runtime := runtimeInjects(r.Nodes) || (len(r.Nodes) == 0 && cfg.DriverDelivery != config.DeliveryHostPath)
	for _, ns := range list.Items {
		s := NamespaceStatus{Name: ns.Name, Enforce: ns.Labels[labelEnforce]}
		s.Excluded = ns.Name == own || slices.Contains(cfg.ExcludedNamespaces, ns.Name)
		if !s.Excluded && !runtime && (s.Enforce == "baseline" || s.Enforce == "restricted") {
			s.Refused = refusedMessage
		}
		r.Namespaces = append(r.Namespaces, s)
	}
	sort.Slice(r.Namespaces, func(i, j int) bool { return r.Namespaces[i].Name < r.Namespaces[j].Name })
	return nil
}

// readPools decodes the pool memory with the webhook's own decoder, so that
// the report shows exactly the pools the webhook would serve, and adds the
// pools the configuration declares that nothing remembered replaces.
func (c *Collector) readPools(ctx context.Context, cfg *config.Configuration, cfgNote, ns, name string, now time.Time, out *PoolsStatus) error {
	defer addDeclared(cfg, now, out)
	out.ConfigMap = name
	if ns == "" {
		return nil
	}
	out.ConfigMap = ns + "/" + name
	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("failed to read the pool memory %s/%s: %w", ns, name, err)
	}
	out.Found = true
	if !cfg.Pinning.ByPool() {
		out.Note = fmt.Sprintf("%d entries, unused: pinning.nodeLabels is empty", len(cm.Data))
		return nil
	}
	mem, errs := pools.DecodeMemory(cm.Data, cfg.Pinning.NodeLabels, cfg.Rules(), now)
	for _, m := range mem {
		out.Pools = append(out.Pools, PoolStatus{Pool: m.Pool, Fingerprint: m.Plan.Fingerprint(), DriverVersion: m.Plan.DriverVersion,
			LastSeen: m.LastSeen, Expires: m.LastSeen.Add(cfg.Pinning.Remember())})
	}
	var notes []string
	if cfgNote != "" {
		notes = append(notes, cfgNote)
	}
	if len(errs) > 0 {
		notes = append(notes, fmt.Sprintf("%d entries ignored: %v", len(errs), errors.Join(errs...)))
	}
	out.Note = strings.Join(notes, "; ")
	return nil
}

// addDeclared adds each declared pool whose memory has expired or was never
// written: the webhook serves it from its declaration.
func addDeclared(cfg *config.Configuration, now time.Time, out *PoolsStatus) {
	for _, m := range cfg.DeclaredPools() {
		i := slices.IndexFunc(out.Pools, func(p PoolStatus) bool { return p.Pool == m.Pool })
		if i >= 0 && now.Before(out.Pools[i].Expires) {
			continue
		}
		out.Pools = append(out.Pools, PoolStatus{Pool: m.Pool, Fingerprint: m.Plan.Fingerprint(), DriverVersion: m.Plan.DriverVersion, Declared: true})
	}
}

func (c *Collector) readEvents(ctx context.Context, now time.Time, r *Report) error {
	sel := fields.OneTermEqualSelector("reason", pools.ReasonLayoutMismatch).String()
	list, err := c.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("failed to list Events: %w", err)
	}
	for _, ev := range list.Items {
		// A fake clientset ignores field selectors; the check costs nothing.
		if ev.Reason != pools.ReasonLayoutMismatch {
			continue
		}
		last := eventTime(ev)
		if now.Sub(last) > eventWindow {
			continue
		}
		count := ev.Count
		if ev.Series != nil {
			count = ev.Series.Count
		}
		r.Events = append(r.Events, EventStatus{Namespace: ev.Namespace, Object: strings.ToLower(ev.InvolvedObject.Kind) + "/" + ev.InvolvedObject.Name,
			Count: max(count, 1), Last: last, Message: ev.Message})
	}
	sort.Slice(r.Events, func(i, j int) bool { return r.Events[i].Last.After(r.Events[j].Last) })
	return nil
}

// eventTime is when an Event last happened, from whichever field its
// recorder filled.
func eventTime(ev corev1.Event) time.Time {
	switch {
	case ev.Series != nil && !ev.Series.LastObservedTime.IsZero():
		return ev.Series.LastObservedTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

// DryRunPod is the smallest GPU pod a user writes, the one the dry run
// tries. It meets Pod Security's restricted level, so that in a namespace
// enforcing it only what the webhook adds can be refused.
func DryRunPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "gpu-injector-status-", Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector-status"}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: new(false),
			SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65532)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name:      "gpu",
				Image:     dryRunImage,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: new(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}

// TryPod is the report's dry run: the GPU pod tried in DryRunNamespace
// when set, else in one of the opted-in namespaces, preferring one where
// Pod Security allows hostPath, so that the answer is about the webhook.
func (c *Collector) TryPod(ctx context.Context, namespaces []NamespaceStatus) DryRunLog {
	if c.DryRunNamespace != "" {
		return c.dryRunIn(ctx, c.DryRunNamespace)
	}
	var candidates []NamespaceStatus
	for _, n := range namespaces {
		if !n.Excluded {
			candidates = append(candidates, n)
		}
	}
	if len(candidates) == 0 {
		return DryRunLog{Outcome: DryRunSkipped, Message: "no namespace is labelled " + layout.LabelInject + "=" + layout.InjectEnabled}
	}
	slices.SortStableFunc(candidates, func(a, b NamespaceStatus) int {
		return boolInt(a.Refused != "" || a.Enforce == "restricted") - boolInt(b.Refused != "" || b.Enforce == "restricted")
	})
	return c.dryRunIn(ctx, candidates[0].Name)
}

func (c *Collector) dryRunIn(ctx context.Context, ns string) DryRunLog {
	return c.dryRunOf(ctx, ns, DryRunPod())
}

func (c *Collector) dryRunOf(ctx context.Context, ns string, pod *corev1.Pod) DryRunLog {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, warnings, err := c.DryRun.DryRunPod(ctx, ns, pod)
	return classify(ns, out, warnings, err)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// classify turns the API server's answer into an outcome.
func classify(ns string, pod *corev1.Pod, warnings []string, err error) DryRunLog {
	d := DryRunLog{Namespace: ns, Warnings: warnings}
	if err != nil {
		msg := err.Error()
		d.Message = msg
		switch {
		case strings.Contains(msg, "failed calling webhook"), errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err):
			d.Outcome = DryRunUnreachable
		case strings.Contains(msg, "denied the request"), strings.Contains(msg, "violates PodSecurity"):
			d.Outcome = DryRunDenied
		default:
			d.Outcome = DryRunError
		}
		return d
	}
	d.Policy = pod.Labels[layout.LabelAdmission] == layout.AdmissionPolicy
	v, ok := pod.Annotations[layout.AnnotationInjected]
	if !ok {
		d.Outcome = DryRunUnchanged
		return d
	}
	d.Outcome = DryRunInjected
	if rec, err := layout.ParseInjected(v); err == nil {
		d.Fingerprint, d.DriverVersion, d.Runtime = rec.Fingerprint, rec.DriverVersion, rec.Runtime
		if d.Fingerprint == "" && rec.StaticLayout != "" {
			d.Fingerprint = "static/" + rec.StaticLayout
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			d.HostPaths = append(d.HostPaths, v.HostPath.Path)
		}
	}
	sort.Strings(d.HostPaths)
	if len(pod.Spec.NodeSelector) > 0 {
		d.NodeSelector = pod.Spec.NodeSelector
	}
	d.RuntimeInject = pod.Annotations[layout.AnnotationRuntimeInject]
	return d
}

// Release is what Config finds of the release gpu-injector runs as.
type Release struct {
	// Config is the release's configuration, the defaults when it cannot
	// be read; Note says so.
	Config *config.Configuration
	Note   string
	// Namespace is where it runs, "" when no webhook was found.
	Namespace string
	// PoolMemory names the pool memory's ConfigMap in Namespace.
	PoolMemory string
}

// Config finds the release and reads its configuration, as Collect does.
func (c *Collector) Config(ctx context.Context) (Release, error) {
	dep, err := c.findWebhook(ctx)
	if err != nil {
		return Release{}, err
	}
	rel := Release{Namespace: c.Namespace, PoolMemory: defaultPoolMemory}
	configMap := ""
	if dep != nil {
		var args map[string]string
		rel.Namespace = dep.Namespace
		args, configMap = deploymentArgs(dep)
		if v, ok := args["--pool-memory-name"]; ok {
			rel.PoolMemory = v
		}
	}
	rel.Config, rel.Note = c.readConfig(ctx, rel.Namespace, configMap)
	return rel, nil
}

// StateReason is the node's state-reason annotation, or why it is not shown.
func StateReason(annotations map[string]string) string {
	v, ok := annotations[layout.AnnotationStateReason]
	if !ok {
		return ""
	}
	reason, err := layout.DecodeStateReason(v)
	if err != nil {
		return "(not shown: " + err.Error() + ")"
	}
	return reason
}

// confirmStalePods keeps of the pods a node's stale driver record names those
// that run on that node (spec.nodeName, which the scheduler sets): a node
// could otherwise have the operator restart pods anywhere.
func (c *Collector) confirmStalePods(ctx context.Context, n *NodeStatus) {
	s := n.StaleDriver
	if s == nil || len(s.Pods) == 0 {
		return
	}
	sel := fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	on := map[string]bool{}
	for opts := (metav1.ListOptions{FieldSelector: sel, Limit: unreadPage}); ; {
		list, err := c.Client.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			n.StaleDriver, n.StaleDriverNote = nil, layout.OneLine(fmt.Sprintf("failed to list the node's pods, to confirm those it names: %v", err), 300)
			return
		}
		for i := range list.Items {
			// A client or a server that ignores the selector must not count.
			if p := &list.Items[i]; p.Spec.NodeName == n.Name {
				on[p.Namespace+"/"+p.Name] = true
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	kept := s.Pods[:0:0]
	for _, p := range s.Pods {
		if on[p] {
			kept = append(kept, p)
		} else {
			n.StaleDriverNotOnNode++
		}
	}
	s.Pods = kept
}
