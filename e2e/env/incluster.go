package env

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ImageName and ImageTag name the gpu-injector image that `make image`'s
// program builds and the environment pushes to the cluster's registry
// (ImageRef); ChartVersion is the version the chart is packaged and pushed
// with, its appVersion ImageTag, so the chart's default tag is the image's.
const (
	ImageName    = "gpu-injector"
	ImageTag     = "e2e"
	ChartVersion = "0.0.0-e2e"
)

// Label selectors of the chart's pods.
const (
	WebhookSelector = "app.kubernetes.io/instance=" + Release + ",app.kubernetes.io/component=webhook"
	ProbeSelector   = "app.kubernetes.io/instance=" + Release + ",app.kubernetes.io/component=nodeprobe"
)

// WebhookDeployment and ProbeDaemonSet are the chart's workloads for Release.
const (
	WebhookDeployment = Release + "-webhook"
	ProbeDaemonSet    = Release + "-nodeprobe"
)

// buildImage runs `make image`'s program into the environment's folder: the
// image index as an OCI image layout, which publish pushes once the
// cluster's registry runs.
func (e *Env) buildImage(ctx context.Context) error {
	e.ImageLayout = filepath.Join(e.Dir, "images", "gpu-injector-oci")
	// Only this machine's platform: the node runs it; linux/arm64 would
	// cross-compile for nothing (hack/image's TestPushPull pulls both).
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/image", "-o=", "-oci=", "-layout", e.ImageLayout,
		"-platforms", "linux/"+runtime.GOARCH, "-ref", "gpu-injector.local/"+ImageName+":"+ImageTag)
	cmd.Dir = e.RepoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to build the image (go run ./hack/image): %w\n%s", err, out)
	}
	return nil
}

// ImageRef is the image in the cluster's registry: what the chart's pods pull.
func (e *Env) ImageRef() string {
	return e.Cluster.RegistryHost + "/" + ImageName + ":" + ImageTag
}

// ChartRef is the chart in the cluster's registry, as helm install names it.
func (e *Env) ChartRef() string {
	return "oci://" + e.Cluster.RegistryHost + "/charts/gpu-injector"
}

// publish does what a maintainer's release does, into the cluster's
// registry: pushes the image index (go-containerregistry's remote.WriteIndex),
// then `helm package`s the chart with ChartVersion and appVersion ImageTag
// and `helm push`es it.
func (e *Env) publish(ctx context.Context) error {
	p, err := layout.FromPath(e.ImageLayout)
	if err != nil {
		return fmt.Errorf("failed to read the image layout %s: %w", e.ImageLayout, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return fmt.Errorf("failed to read the image layout %s: %w", e.ImageLayout, err)
	}
	m, err := top.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		return fmt.Errorf("the image layout %s lists %d indexes, want 1 (%v)", e.ImageLayout, len(m.Manifests), err)
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return fmt.Errorf("failed to read the image index of %s: %w", e.ImageLayout, err)
	}
	ref, err := name.NewTag(e.ImageRef())
	if err != nil {
		return err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("failed to push the image index to %s: %w", ref, err)
	}
	charts := filepath.Join(e.Dir, "charts")
	if _, err := e.HelmCommand(ctx, "package", filepath.Join(e.RepoRoot, "charts", "gpu-injector"),
		"--version", ChartVersion, "--app-version", ImageTag, "--destination", charts); err != nil {
		return err
	}
	tgz := filepath.Join(charts, "gpu-injector-"+ChartVersion+".tgz")
	if _, err := e.HelmCommand(ctx, "push", tgz, "oci://"+e.Cluster.RegistryHost+"/charts", "--plain-http"); err != nil {
		return err
	}
	return nil
}

// HelmValues are the --set values of the environment's helm install and
// upgrade: the image in the cluster's registry, as a user of a private
// registry sets it, and Options.ChartValues. The tag is the packaged chart's
// appVersion already; set, it says which image the tests expect.
func (e *Env) HelmValues() []string {
	return append([]string{
		"image.repository=" + e.Cluster.RegistryHost + "/" + ImageName,
		"image.tag=" + ImageTag,
		"image.pullPolicy=IfNotPresent",
	}, e.opts.ChartValues...)
}

// Helm runs the real helm against the cluster and returns its output.
func (e *Env) HelmCommand(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.Helm, append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	// helm keeps a cache and config per user; keep them in the environment.
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(e.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(e.Dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(e.Dir, "helm", "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s failed: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// probeOnGPUNodes is the one value besides the image's: the probe on GPU
// nodes only, as docs/helm.md shows with the label NVIDIA's feature discovery
// sets. The chart's default runs it on every node, and no kubelet would run
// its pods on the API-only nodes (which lack the label): they would stay
// Pending, and a DaemonSet with pods that never become ready neither passes
// helm's --wait nor rolls out a new configuration.
const probeOnGPUNodes = `nodeprobe.nodeSelector.nvidia\.com/gpu\.present=true`

// helmArgs are the --set flags of HelmValues and sets.
func (e *Env) helmArgs(sets ...string) []string {
	// The chart's defaults start the probe whatever the propagation of the
	// host's mounts (this machine's / is private where it is itself a
	// container, as a node that boots without systemd has it). The one
	// difference from a node: the node's mount namespace is not init's.
	args := []string{"--set-string", probeOnGPUNodes}
	if e.Cluster != nil {
		args = append(args, "--set-string", "nodeprobe.extraArgs[0]=--host-mount-table="+e.Cluster.NodeMountTable())
	}
	for _, s := range append(e.HelmValues(), sets...) {
		args = append(args, "--set", s)
	}
	return args
}

// installChart is the README's helm install from an OCI registry, the
// cluster's, with the image values and the probe on GPU nodes only.
func (e *Env) installChart(ctx context.Context) error {
	args := []string{"install", Release, e.ChartRef(), "--version", ChartVersion, "--plain-http",
		"--namespace", Namespace, "--create-namespace", "--wait", "--timeout", "5m"}
	args = append(args, e.helmArgs()...)
	if _, err := e.HelmCommand(ctx, args...); err != nil {
		return fmt.Errorf("%w\n%s", err, e.podsReport(context.Background()))
	}
	return e.readRelease(ctx)
}

// readRelease learns what the release made: its service accounts and the
// configuration the API-only nodes' probes read.
func (e *Env) readRelease(ctx context.Context) error {
	sas, err := e.Clientset.CoreV1().ServiceAccounts(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + Release})
	if err != nil {
		return fmt.Errorf("failed to list the release's service accounts: %w", err)
	}
	for _, sa := range sas.Items {
		switch sa.Labels["app.kubernetes.io/component"] {
		case "webhook":
			e.WebhookSA = sa.Name
		case "nodeprobe":
			e.ProbeSA = sa.Name
		}
	}
	cms, err := e.Clientset.CoreV1().ConfigMaps(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + Release})
	if err != nil {
		return fmt.Errorf("failed to list the release's config maps: %w", err)
	}
	for _, cm := range cms.Items {
		if data := cm.Data["config.yaml"]; data != "" {
			e.ConfigFile = filepath.Join(e.Dir, "config.yaml")
			if err := os.WriteFile(e.ConfigFile, []byte(data), 0o644); err != nil {
				return fmt.Errorf("failed to write %s: %w", e.ConfigFile, err)
			}
		}
	}
	switch {
	case e.ConfigFile == "":
		return errors.New("the release has no ConfigMap with config.yaml")
	case e.WebhookSA == "" || e.ProbeSA == "":
		return fmt.Errorf("the release lacks a service account (webhook %q, nodeprobe %q)", e.WebhookSA, e.ProbeSA)
	}
	return nil
}

// WebhookPods are the webhook's pods now, ready or not, sorted by name.
func (e *Env) WebhookPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := e.pods(ctx, WebhookSelector)
	// The local webhook's stand-in Pod carries the selector's labels but is
	// no replica of the chart's.
	return slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.Name == localWebhookPod }), err
}

// ProbePod is the chart's probe pod on the kubelet node.
func (e *Env) ProbePod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := e.pods(ctx, ProbeSelector)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Spec.NodeName == e.KubeletNode().Name && pods[i].DeletionTimestamp == nil {
			return &pods[i], nil
		}
	}
	return nil, fmt.Errorf("no probe pod on %s", e.KubeletNode().Name)
}

func (e *Env) pods(ctx context.Context, selector string) ([]corev1.Pod, error) {
	list, err := e.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("failed to list pods %s: %w", selector, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// PodReady reports whether the pod is Ready and not terminating.
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WebhookMetricsURLs are the metrics endpoints of the ready webhook pods, on
// their pod IPs, which this host reaches over the node's bridge.
func (e *Env) WebhookMetricsURLs(ctx context.Context) ([]string, error) {
	pods, err := e.WebhookPods(ctx)
	if err != nil {
		return nil, err
	}
	var urls []string
	for i := range pods {
		if PodReady(&pods[i]) {
			urls = append(urls, fmt.Sprintf("http://%s:8080/metrics", pods[i].Status.PodIP))
		}
	}
	e.mu.Lock()
	if e.localMetrics != "" {
		urls = append(urls, e.localMetrics)
	}
	e.mu.Unlock()
	return urls, nil
}

// WaitWebhookReady waits until the Deployment has all its replicas ready and
// updated and no old pod is left.
func (e *Env) WaitWebhookReady(ctx context.Context) error {
	var last string
	err := e.poll(ctx, "the webhook Deployment to be ready", func(ctx context.Context) (bool, error) {
		d, err := e.Clientset.AppsV1().Deployments(Namespace).Get(ctx, WebhookDeployment, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		s := d.Status
		last = fmt.Sprintf("replicas %d, updated %d, ready %d, available %d, want %d (generation %d, observed %d)",
			s.Replicas, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas, want, d.Generation, s.ObservedGeneration)
		if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.Replicas != want {
			return false, nil
		}
		pods, err := e.WebhookPods(ctx)
		if err != nil {
			return false, nil
		}
		ready := 0
		for i := range pods {
			if PodReady(&pods[i]) {
				ready++
			}
		}
		return ready == int(want) && len(pods) == int(want), nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)\n%s", err, last, e.podsReport(context.Background()))
	}
	return nil
}

// ScaleWebhook sets the webhook Deployment's replicas and waits: for every
// pod gone at 0, for all ready otherwise.
func (e *Env) ScaleWebhook(ctx context.Context, replicas int32) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := e.Clientset.AppsV1().Deployments(Namespace).Patch(ctx, WebhookDeployment, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("failed to scale %s to %d: %w", WebhookDeployment, replicas, err)
	}
	if replicas > 0 {
		return e.WaitWebhookReady(ctx)
	}
	return e.poll(ctx, "every webhook pod to be gone", func(ctx context.Context) (bool, error) {
		pods, err := e.WebhookPods(ctx)
		return err == nil && len(pods) == 0, nil
	})
}

// webhookReplicas is the chart's replica count (values.yaml), which
// StartWebhook restores.
func (e *Env) webhookReplicas(ctx context.Context) int32 {
	out, err := e.HelmCommand(ctx, "get", "values", Release, "-n", Namespace, "--all", "-o", "json")
	if err == nil {
		if i := strings.Index(out, `"replicas":`); i >= 0 {
			var n int32
			if _, err := fmt.Sscanf(out[i+len(`"replicas":`):], "%d", &n); err == nil && n > 0 {
				return n
			}
		}
	}
	return 2
}

// StopWebhook scales the webhook Deployment to zero and waits until no
// webhook pod is left: the API server then has no endpoint to call.
func (e *Env) StopWebhook() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return e.ScaleWebhook(ctx, 0)
}

// StartWebhook scales the webhook back to the chart's replicas and waits
// until they are ready and see every node's layout.
func (e *Env) StartWebhook(ctx context.Context) error {
	if err := e.ScaleWebhook(ctx, e.webhookReplicas(ctx)); err != nil {
		return err
	}
	fps, err := e.WaitProbed(ctx)
	if err != nil {
		return err
	}
	return e.WaitWebhookSees(ctx, fps)
}

// RestartWebhook rolls the webhook Deployment (kubectl rollout restart) and
// waits until the new pods serve.
func (e *Env) RestartWebhook(ctx context.Context) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := e.Clientset.AppsV1().Deployments(Namespace).Patch(ctx, WebhookDeployment, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("failed to restart %s: %w", WebhookDeployment, err)
	}
	if err := e.WaitWebhookReady(ctx); err != nil {
		return err
	}
	fps, err := e.WaitProbed(ctx)
	if err != nil {
		return err
	}
	return e.WaitWebhookSees(ctx, fps)
}

// SignalContainer sends a signal (SIGHUP, SIGKILL, ...) to the main process
// of a pod's container through the node's runtime, as `crictl stop` or
// an OOM kill would reach it: the kubelet then sees the exit and restarts it.
func (e *Env) SignalContainer(ctx context.Context, p *corev1.Pod, container, signal string) error {
	id := ""
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			id = cs.ContainerID
		}
	}
	if id == "" {
		return fmt.Errorf("failed to signal %s/%s[%s]: no container ID in its status", p.Namespace, p.Name, container)
	}
	if err := e.Cluster.SignalContainer(ctx, id, signal); err != nil {
		return fmt.Errorf("failed to send %s to %s/%s[%s]: %w", signal, p.Namespace, p.Name, container, err)
	}
	return nil
}

// WaitProbePod waits until the DaemonSet's probe pod on the kubelet node is
// Ready, and returns it.
func (e *Env) WaitProbePod(ctx context.Context) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := e.poll(ctx, "the probe pod on "+e.KubeletNode().Name+" to be ready", func(ctx context.Context) (bool, error) {
		p, err := e.ProbePod(ctx)
		if err != nil {
			return false, nil
		}
		pod = p
		return PodReady(p), nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, e.podsReport(context.Background()))
	}
	return pod, nil
}

// probeRestarts is the restart count of the probe container on the kubelet node.
func (e *Env) probeRestarts() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := e.ProbePod(ctx)
	if err != nil {
		return -1
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "nodeprobe" {
			return int(cs.RestartCount)
		}
	}
	return 0
}

// PodLog is a container's log through the API server, the previous
// container's with previous set; an error becomes the text.
func (e *Env) PodLog(ctx context.Context, p *corev1.Pod, container string, previous bool, tail int64) string {
	opts := &corev1.PodLogOptions{Container: container, Previous: previous}
	if tail > 0 {
		opts.TailLines = &tail
	}
	b, err := e.Clientset.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// podsReport describes the release's pods and workloads, with the last log
// lines of each pod, for error messages.
func (e *Env) podsReport(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := e.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("(failed to list pods in %s: %v)", Namespace, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		fmt.Fprintf(&b, "--- pod %s on %q: phase %s, ready %v", p.Name, p.Spec.NodeName, p.Status.Phase, PodReady(p))
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, ", %s restarts %d", cs.Name, cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s: %s", w.Reason, w.Message)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				fmt.Fprintf(&b, "; %s: %s", c.Type, c.Message)
			}
		}
		b.WriteString("\n")
		if len(p.Spec.Containers) > 0 && p.Status.Phase != corev1.PodPending {
			b.WriteString(e.PodLog(ctx, p, p.Spec.Containers[0].Name, false, 15))
		}
	}
	evs, err := e.Clientset.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning {
				fmt.Fprintf(&b, "event %s/%s %s: %s\n", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
			}
		}
	}
	return b.String()
}

// savePodLogs copies the logs of the release's containers (the kubelet's
// files, current and previous runs) into LogsDir/pods before the cluster,
// and its folder, go away.
func (e *Env) savePodLogs() error {
	if e.Cluster == nil {
		return nil
	}
	src := filepath.Join(e.Cluster.Dir, "pod-logs")
	entries, err := os.ReadDir(src)
	if err != nil {
		return nil
	}
	dst := filepath.Join(e.LogsDir, "pods")
	var errs []error
	for _, ent := range entries {
		if !strings.HasPrefix(ent.Name(), Namespace+"_") {
			continue
		}
		root := filepath.Join(src, ent.Name())
		errs = append(errs, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			out := filepath.Join(dst, ent.Name(), rel)
			if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
				return err
			}
			return os.WriteFile(out, data, 0o644)
		}))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("failed to save the pod logs: %w", err)
	}
	return nil
}

// daemonSetReady reports whether the probe DaemonSet runs an up-to-date,
// ready pod on every node it selects.
func daemonSetReady(ds *appsv1.DaemonSet) bool {
	s := ds.Status
	return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled > 0 &&
		s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberReady == s.DesiredNumberScheduled
}

// WaitProbeDaemonSet waits until the probe DaemonSet is rolled out.
func (e *Env) WaitProbeDaemonSet(ctx context.Context) error {
	return e.poll(ctx, "the probe DaemonSet to be ready", func(ctx context.Context) (bool, error) {
		ds, err := e.Clientset.AppsV1().DaemonSets(Namespace).Get(ctx, ProbeDaemonSet, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, err
		}
		return err == nil && daemonSetReady(ds), nil
	})
}

// UpgradeChart runs `helm upgrade` of the release (the chart in the
// cluster's registry, as installed) with HelmValues and the
// extra --set values (none: back to the installed values), waits for the
// rollout (a configuration change rolls the pods through their checksum
// annotation), and until every ready webhook replica sees every node's layout.
func (e *Env) UpgradeChart(ctx context.Context, sets ...string) error {
	return e.UpgradeChartWithValues(ctx, "", sets...)
}

// UpgradeChartWithValues is UpgradeChart with a values file (helm -f) too,
// for values that --set cannot write, such as a string of JSON; empty:
// none.
func (e *Env) UpgradeChartWithValues(ctx context.Context, valuesFile string, sets ...string) error {
	if err := e.upgradeRollout(ctx, valuesFile, sets...); err != nil {
		return err
	}
	fps, err := e.WaitProbed(ctx)
	if err != nil {
		return err
	}
	return e.WaitWebhookSees(ctx, fps)
}

// UpgradeChartRollout is UpgradeChart without its wait for the webhook to see
// every node's layout, for a test that has cordoned nodes: the index leaves
// an unschedulable node's layout out, so that wait would not end.
func (e *Env) UpgradeChartRollout(ctx context.Context, sets ...string) error {
	return e.upgradeRollout(ctx, "", sets...)
}

// upgradeRollout runs `helm upgrade` and waits for the webhook and the probes
// to roll out.
func (e *Env) upgradeRollout(ctx context.Context, valuesFile string, sets ...string) error {
	args := []string{"upgrade", Release, e.ChartRef(), "--version", ChartVersion, "--plain-http",
		"--namespace", Namespace, "--wait", "--timeout", "4m"}
	if valuesFile != "" {
		args = append(args, "-f", valuesFile)
	}
	args = append(args, e.helmArgs(sets...)...)
	if _, err := e.HelmCommand(ctx, args...); err != nil {
		return fmt.Errorf("%w\n%s", err, e.podsReport(context.Background()))
	}
	if err := e.WaitWebhookReady(ctx); err != nil {
		return err
	}
	if err := e.WaitProbeDaemonSet(ctx); err != nil {
		return err
	}
	return e.readRelease(ctx)
}

// localWebhookPod names the Pod object that stands for the local webhook.
const localWebhookPod = WebhookDeployment + "-local"

// publishLocalWebhook makes the local webhook an endpoint of the chart's
// Service the way a replica is one: a Pod with the Service's selector labels,
// bound to an API-only node (no kubelet runs it, nor rewrites its status),
// Running and Ready at the bridge's address with the Service's target port.
// The controllers then list it in the Endpoints and the EndpointSlices, so
// the API server reaches it whichever it resolves a Service through:
// Endpoints before 1.34, EndpointSlices since. A hand-made EndpointSlice
// served only the latter, and a hand-made Endpoints of a Service with a
// selector is the endpoints controller's to overwrite.
func (e *Env) publishLocalWebhook(ctx context.Context, port int) error {
	var node string
	for _, n := range e.Nodes {
		if !n.Kubelet {
			node = n.Name
			break
		}
	}
	if node == "" {
		return errors.New("no API-only node to bind the local webhook's Pod to")
	}
	svc, err := e.Clientset.CoreV1().Services(Namespace).Get(ctx, WebhookDeployment, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("failed to get the webhook Service: %w", err)
	}
	// The chart's Service has one port, whose target is the webhook's named port.
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.Type != intstr.String {
		return fmt.Errorf("the webhook Service has ports %+v, want one whose targetPort names a container port", svc.Spec.Ports)
	}
	target := svc.Spec.Ports[0].TargetPort.StrVal
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: localWebhookPod, Namespace: Namespace, Labels: svc.Spec.Selector},
		Spec: corev1.PodSpec{
			NodeName: node,
			// Tolerates what an API-only node carries; never pulled or run.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "webhook", Image: "gpu-injector.local/local-webhook:none", ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{Name: target, ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if _, err := e.Clientset.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("failed to create the local webhook's Pod: %w", err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     e.Cluster.BridgeIP,
		PodIPs:    []corev1.PodIP{{IP: e.Cluster.BridgeIP}},
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	if _, err := e.Clientset.CoreV1().Pods(Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("failed to mark the local webhook's Pod ready: %w", err)
	}
	// Ready once the endpoint is listed where this API server looks.
	return e.poll(ctx, "the local webhook as an endpoint of Service "+WebhookDeployment, func(ctx context.Context) (bool, error) {
		list, err := e.Clientset.DiscoveryV1().EndpointSlices(Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + WebhookDeployment})
		if err != nil {
			return false, nil
		}
		inSlice := false
		for _, sl := range list.Items {
			for _, ep := range sl.Endpoints {
				inSlice = inSlice || slices.Contains(ep.Addresses, e.Cluster.BridgeIP)
			}
		}
		eps, err := e.Clientset.CoreV1().Endpoints(Namespace).Get(ctx, WebhookDeployment, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		inEndpoints := false
		for _, ss := range eps.Subsets {
			for _, a := range ss.Addresses {
				inEndpoints = inEndpoints || a.IP == e.Cluster.BridgeIP
			}
		}
		return inSlice && inEndpoints, nil
	})
}

// StartLocalWebhook runs one more webhook replica as a local process of the
// same binary, with a token of the chart's webhook service account, in self
// certificate mode (it serves the pair in the chart's Secret), behind the
// chart's Service through an EndpointSlice of its own at the node's bridge
// address. It is for the one test that deletes the kubelet node, and with it
// the chart's replicas: in a real cluster the webhook runs on other nodes
// than the GPU pool that scales to zero; here only one node runs pods. The
// returned function stops it and removes its endpoint.
func (e *Env) StartLocalWebhook(ctx context.Context) (func() error, error) {
	kc := filepath.Join(e.Dir, "local-webhook.kubeconfig")
	if err := e.TokenKubeconfig(ctx, e.WebhookSA, nil, kc); err != nil {
		return nil, err
	}
	certDir := filepath.Join(e.Dir, "local-webhook-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", certDir, err)
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	readyURL := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])
	p := newProc("local-webhook", e.Binary, filepath.Join(e.LogsDir, "local-webhook.log"), false,
		"webhook",
		"--cert-mode=self",
		"--cert-dir="+certDir,
		fmt.Sprintf("--port=%d", ports[0]),
		"--config="+e.ConfigFile,
		"--kubeconfig="+kc,
		"--namespace="+Namespace,
		"--cert-secret-name="+Release+"-webhook-tls",
		"--service-name="+WebhookDeployment,
		"--webhook-configuration-name="+Release,
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[2]),
		"--shutdown-delay=0",
	)
	if err := p.start(); err != nil {
		return nil, err
	}
	stop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := e.Clientset.CoreV1().Pods(Namespace).Delete(ctx, localWebhookPod, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		if apierrors.IsNotFound(err) {
			err = nil
		}
		e.mu.Lock()
		e.localMetrics = ""
		e.mu.Unlock()
		return errors.Join(err, p.stop(10*time.Second))
	}
	err := e.poll(ctx, "the local webhook's /readyz", func(ctx context.Context) (bool, error) {
		if gone, err := p.exited(); gone {
			return false, err
		}
		return httpOK(ctx, readyURL), nil
	})
	if err != nil {
		_ = stop()
		return nil, withLog(err, p)
	}
	if err := e.publishLocalWebhook(ctx, ports[0]); err != nil {
		_ = stop()
		return nil, err
	}
	e.mu.Lock()
	e.localMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2])
	e.mu.Unlock()
	return stop, nil
}
