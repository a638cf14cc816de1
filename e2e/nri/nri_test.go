//go:build e2e

// Package nri is the end-to-end suite of runtime injection: the same
// environment as the main suite (package env), but the kubelet node runs
// containerd 2.x with NRI, and the chart runs gpu-injector's NRI plugin beside
// each probe. GPU pods in namespaces whose Pod Security level forbids hostPath
// get the driver from the plugin, with no hostPath in their spec.
//
// E2E_RUNTIME=crio runs the same tests on CRI-O instead (cluster.RuntimeCRIO);
// the ones that read what only containerd exposes say so and skip there.
package nri

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nriplugin"
)

var testEnv *env.Env

func TestMain(m *testing.M) {
	rt, err := suiteRuntime(os.Getenv("E2E_RUNTIME"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The stale driver scan every two seconds, not every minute: the suite
	// waits for its record.
	values := []string{"runtimeInjection.enabled=true", "runtimeInjection.staleDriver.interval=2s"}
	if rt == cluster.RuntimeCRIO {
		// As docs/runtime-injection.md tells a user of CRI-O nodes: CRI-O
		// refuses the probe's recursively read-only host root.
		values = append(values, "nodeprobe.recursiveReadOnly=false")
	}
	os.Exit(env.RunSuite(m, "runtime injection", env.Options{
		Runtime:       rt,
		ChartValues:   values,
		KeepOnFailure: true,
	}, func(e *env.Env) { testEnv = e }))
}

// suiteRuntime is the kubelet node's runtime for E2E_RUNTIME's value:
// containerd 2.x when empty or "containerd", CRI-O for "crio".
func suiteRuntime(name string) (cluster.Runtime, error) {
	switch name {
	case "", "containerd":
		return cluster.RuntimeNRI, nil
	case "crio":
		return cluster.RuntimeCRIO, nil
	}
	return "", fmt.Errorf("E2E_RUNTIME=%q: want containerd (the default) or crio", name)
}

// needContainerd skips a test that reads what only containerd exposes.
func needContainerd(t *testing.T, what string) {
	t.Helper()
	if r := testEnv.Cluster.Runtime; r != cluster.RuntimeNRI {
		t.Skipf("reads %s, which only containerd has (runtime %s)", what, r)
	}
}

const (
	apiTimeout = 30 * time.Second
	runTimeout = 3 * time.Minute
	gpu        = corev1.ResourceName("nvidia.com/gpu")
	legacyGPU  = corev1.ResourceName("alpha.kubernetes.io/nvidia-gpu")
)

func client() kubernetes.Interface { return testEnv.Clientset }

func poll(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, cond); err != nil {
		t.Fatalf("failed waiting %s for %s: %v", timeout, what, err)
	}
}

// namespace makes an opted-in namespace that enforces a Pod Security level.
func namespace(t *testing.T, level string) string {
	t.Helper()
	return newNamespace(t, "nri-"+level+"-", map[string]string{
		layout.LabelInject:                   layout.InjectEnabled,
		"pod-security.kubernetes.io/enforce": level,
	})
}

// newNamespace makes a namespace, deleted after the test, and waits for its
// default service account (pods need it).
func newNamespace(t *testing.T, prefix string, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix, Labels: labels}}
	created, err := client().CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create a namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().Namespaces().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
	poll(t, apiTimeout, "the default service account of "+created.Name, func(ctx context.Context) (bool, error) {
		_, err := client().CoreV1().ServiceAccounts(created.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return created.Name
}

// restricted is a container security context that Pod Security's
// restricted level accepts.
func restricted() *corev1.SecurityContext {
	no, yes, uid := false, true, int64(65532)
	return &corev1.SecurityContext{
		RunAsNonRoot: &yes, RunAsUser: &uid, AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// container runs cmd on the driverless workload image with one GPU of res.
func container(name string, res corev1.ResourceName, cmd ...string) corev1.Container {
	return corev1.Container{Name: name, Image: env.WorkloadImage, ImagePullPolicy: corev1.PullNever, Command: cmd,
		Resources:       corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}},
		SecurityContext: restricted()}
}

// classicJob is the nvidia-smi Job of the old GPU tutorials: the legacy
// limit, no volumes, no node selector; a second container loads libcuda.
func classicJob() *batchv1.Job {
	backoff, no := int32(0), false
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-smi"},
		Spec: batchv1.JobSpec{BackoffLimit: &backoff, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{
				container("nvidia-smi", legacyGPU, "/usr/local/nvidia/bin/nvidia-smi"),
				container("cuda-check", legacyGPU, workloads.CUDACheck),
			},
		}}},
	}
}

// cudaPod is a CUDA program's pod on the kubelet node (by its accelerator).
func cudaPod(name string) *corev1.Pod {
	no := false
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
		NodeSelector: map[string]string{env.LabelAccelerator: testEnv.KubeletNode().Accelerator},
		Containers:   []corev1.Container{container("cuda", gpu, workloads.CUDACheck)},
	}}
}

// assertRuntimeInjected checks that the pod carries no hostPath volume and
// is marked for the plugin, for the containers named.
func assertRuntimeInjected(t *testing.T, p *corev1.Pod, containers ...string) {
	t.Helper()
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("pod %s has hostPath volume %s (%s); runtime injection adds none", p.Name, v.Name, v.HostPath.Path)
		}
	}
	if got, want := p.Annotations[layout.AnnotationRuntimeInject], strings.Join(containers, ","); got != want {
		t.Errorf("pod %s: %s=%q, want %q", p.Name, layout.AnnotationRuntimeInject, got, want)
	}
	for _, c := range containers {
		key := layout.AnnotationNRIRequiredPlugins + "/container." + c
		if got := p.Annotations[key]; !strings.Contains(got, layout.NRIPluginName) {
			t.Errorf("pod %s: %s=%q, want it to require %s", p.Name, key, got, layout.NRIPluginName)
		}
	}
	if fp, ok := p.Spec.NodeSelector[layout.LabelFingerprint]; ok {
		t.Errorf("pod %s is pinned to layout %s; runtime injection pins no layout", p.Name, fp)
	}
}

func podLog(t *testing.T, ns, pod, c string) string {
	t.Helper()
	b, err := client().CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: c}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("failed to read the log of %s/%s[%s]: %v", ns, pod, c, err)
	}
	return string(b)
}

func waitDone(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	poll(t, runTimeout, "pod "+ns+"/"+name+" to finish", func(ctx context.Context) (bool, error) {
		got, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		p = got
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	return p
}

// assertSawDriver checks cuda-check's log: libcuda.so.1 loaded from the
// folder the plugin mounted, of the node's driver version.
func assertSawDriver(t *testing.T, log, version string) {
	t.Helper()
	if want := "from /usr/local/nvidia/lib64/libcuda.so.1 driver=" + version; !strings.Contains(log, want) {
		t.Errorf("cuda-check log:\n%s\nwant %q", log, want)
	}
}

// waitPluginReady waits until the kubelet node carries the plugin's label.
func waitPluginReady(t *testing.T) {
	t.Helper()
	kn := testEnv.KubeletNode()
	poll(t, 2*time.Minute, kn.Name+" to carry "+layout.LabelNRIPlugin, func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		return err == nil && n.Labels[layout.LabelNRIPlugin] == layout.NRIProtocol, nil
	})
}

// createInjected creates a pod, retrying while the webhook has not yet seen
// the plugin's label (the pod would then be refused by Pod Security).
func createInjected(t *testing.T, ns string, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	var created *corev1.Pod
	poll(t, apiTimeout, "the webhook to inject pod "+p.Name+" at the runtime", func(ctx context.Context) (bool, error) {
		got, err := client().CoreV1().Pods(ns).Create(ctx, p.DeepCopy(), metav1.CreateOptions{})
		if apierrors.IsForbidden(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		created = got
		return true, nil
	})
	return created
}

// TestBaselineClassicJob: the classic nvidia-smi Job, legacy limit and no
// volumes, in a namespace that enforces baseline: the API server admits it,
// its pod carries no hostPath, and both containers see the node's driver.
func TestBaselineClassicJob(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")
	kn := testEnv.KubeletNode()
	var pod *corev1.Pod
	poll(t, apiTimeout, "the Job's pod", func(ctx context.Context) (bool, error) {
		if _, err := client().BatchV1().Jobs(ns).Get(ctx, "nvidia-smi", metav1.GetOptions{}); apierrors.IsNotFound(err) {
			if _, err := client().BatchV1().Jobs(ns).Create(ctx, classicJob(), metav1.CreateOptions{}); err != nil {
				return false, err
			}
		}
		pods, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=nvidia-smi"})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	assertRuntimeInjected(t, pod, "nvidia-smi", "cuda-check")
	for _, c := range pod.Spec.Containers {
		if _, ok := c.Resources.Limits[legacyGPU]; ok {
			t.Errorf("container %s still asks for %s", c.Name, legacyGPU)
		}
	}
	done := waitDone(t, ns, pod.Name)
	smi, check := podLog(t, ns, pod.Name, "nvidia-smi"), podLog(t, ns, pod.Name, "cuda-check")
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("the Job's pod %s; nvidia-smi:\n%s\ncuda-check:\n%s", done.Status.Phase, smi, check)
	}
	if done.Spec.NodeName != kn.Name {
		t.Errorf("ran on %s, want %s", done.Spec.NodeName, kn.Name)
	}
	if want := "Driver Version: " + kn.DriverVersion; !strings.Contains(smi, want) || !strings.Contains(smi, standin.Notice) {
		t.Errorf("nvidia-smi log:\n%s\nwant %q and the stand-in's notice", smi, want)
	}
	assertSawDriver(t, check, kn.DriverVersion)
}

// TestRestrictedCUDAPod: a compliant CUDA pod in a restricted namespace, on
// nodes that all have the plugin: no pin of any kind, and it runs.
func TestRestrictedCUDAPod(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "restricted")
	p := createInjected(t, ns, cudaPod("cuda"))
	assertRuntimeInjected(t, p, "cuda")
	if v, ok := p.Spec.NodeSelector[layout.LabelNRIPlugin]; ok {
		t.Errorf("pinned by %s=%s, though every node it can use has the plugin", layout.LabelNRIPlugin, v)
	}
	done := waitDone(t, ns, p.Name)
	log := podLog(t, ns, p.Name, "cuda")
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s:\n%s", done.Status.Phase, log)
	}
	assertSawDriver(t, log, testEnv.KubeletNode().DriverVersion)
}

// TestBaselineWithoutPlugin: a pod that can only go to a node without the
// plugin (an API-only node of another layout) gets today's clear refusal.
func TestBaselineWithoutPlugin(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")
	var other *env.Node
	for _, n := range testEnv.Nodes {
		if !n.Kubelet {
			other = n
			break
		}
	}
	p := cudaPod("elsewhere")
	p.Spec.NodeSelector = map[string]string{env.LabelAccelerator: other.Accelerator}
	_, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hostPath") {
		t.Fatalf("create = %v, want Pod Security's refusal of hostPath volumes", err)
	}
}

// TestDriverUpgrade: after the node's driver is upgraded, the next pod gets
// the new driver from the plugin, with the same spec as before.
func TestDriverUpgrade(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")
	kn := testEnv.KubeletNode()
	before := createInjected(t, ns, cudaPod("before"))
	if d := waitDone(t, ns, before.Name); d.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod before the upgrade %s:\n%s", d.Status.Phase, podLog(t, ns, before.Name, "cuda"))
	}
	old := kn.DriverVersion
	next := "550.163.01"
	if _, err := testEnv.UpgradeDriver(context.Background(), kn.Name, next); err != nil {
		t.Fatalf("failed to upgrade the driver: %v", err)
	}
	t.Cleanup(func() {
		if _, err := testEnv.UpgradeDriver(context.Background(), kn.Name, old); err != nil {
			t.Errorf("failed to restore driver %s: %v", old, err)
		}
	})
	after := createInjected(t, ns, cudaPod("after"))
	assertRuntimeInjected(t, after, "cuda")
	for _, k := range []string{layout.AnnotationRuntimeInject, layout.AnnotationInjected} {
		if before.Annotations[k] != after.Annotations[k] {
			t.Errorf("annotation %s changed with the driver: %q then %q", k, before.Annotations[k], after.Annotations[k])
		}
	}
	d := waitDone(t, ns, after.Name)
	log := podLog(t, ns, after.Name, "cuda")
	if d.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod after the upgrade %s:\n%s", d.Status.Phase, log)
	}
	assertSawDriver(t, log, next)
}

// pluginPIDs finds the NRI plugin's processes on this machine (the chart's
// container on the kubelet node).
func pluginPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("failed to list processes: %v", err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "gpu-injector" && args[1] == "nri-plugin" {
			out = append(out, pid)
		}
	}
	return out
}

// TestPluginDown: while the plugin is down, a pod admitted for runtime
// injection is not started without its driver: NRI's default validator
// refuses its container (required-plugins) and the kubelet retries; once
// the plugin is back, the pod runs with the driver. The plugin is killed as
// often as the kubelet restarts it, until the pod's container was refused.
func TestPluginDown(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			for _, pid := range pluginPIDs(t) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	resumed := false
	resume := func() {
		if !resumed {
			close(stop)
			<-stopped
			resumed = true
		}
	}
	t.Cleanup(resume)
	// The probe takes the node's label away once the plugin's heartbeat is
	// stale; a pod created before that is the one this is about.
	p := createInjected(t, ns, cudaPod("meanwhile"))
	assertRuntimeInjected(t, p, "cuda")
	var why string
	poll(t, 2*time.Minute, "the container to be refused while the plugin is down", func(ctx context.Context) (bool, error) {
		got, err := client().CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod %s while the plugin was down: %s", got.Status.Phase, podLog(t, ns, p.Name, "cuda"))
		}
		for _, cs := range got.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
				why = w.Message
				return true, nil
			}
		}
		return false, nil
	})
	if !strings.Contains(why, layout.NRIPluginName) {
		t.Errorf("the container was refused with %q, want the validator's word on the missing plugin %s", why, layout.NRIPluginName)
	}
	t.Logf("while the plugin was down: %s", why)
	resume()
	waitPluginReady(t)
	d := waitDone(t, ns, p.Name)
	log := podLog(t, ns, p.Name, "cuda")
	if d.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod after the plugin came back %s:\n%s", d.Status.Phase, log)
	}
	assertSawDriver(t, log, testEnv.KubeletNode().DriverVersion)
}

// timer is a containerd timer's total, read from its histogram.
type timer struct {
	count float64
	sum   float64
	// under5ms counts the observations at or below 5 ms.
	under5ms float64
}

func (a timer) minus(b timer) timer {
	return timer{count: a.count - b.count, sum: a.sum - b.sum, under5ms: a.under5ms - b.under5ms}
}

func (a timer) meanMS() float64 {
	if a.count == 0 {
		return 0
	}
	return a.sum / a.count * 1000
}

// containerdTimers reads the NRI runtime's metrics: the CRI's container
// create and start timers and NRI's latency of gpu-injector's CreateContainer.
func containerdTimers(t *testing.T) (create, start, plugin timer) {
	t.Helper()
	resp, err := http.Get(testEnv.Cluster.ContainerdMetricsURL)
	if err != nil {
		t.Fatalf("failed to read containerd's metrics: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("failed to parse containerd's metrics: %v", err)
	}
	read := func(name string, match func(map[string]string) bool) timer {
		var out timer
		f := families[name]
		if f == nil {
			return out
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if !match(labels) {
				continue
			}
			h := m.GetHistogram()
			out.count += float64(h.GetSampleCount())
			out.sum += h.GetSampleSum()
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() == 0.005 {
					out.under5ms += float64(b.GetCumulativeCount())
				}
			}
		}
		return out
	}
	any := func(map[string]string) bool { return true }
	create = read("containerd_cri_container_create_seconds", any)
	start = read("containerd_cri_container_start_seconds", any)
	plugin = read("containerd_nri_plugin_latency_seconds", func(l map[string]string) bool {
		return strings.HasSuffix(l["plugin"], "-"+layout.NRIPluginName) && l["operation"] == "CreateContainer"
	})
	return create, start, plugin
}

// TestContainerStartCost measures what the plugin adds to a container's
// creation, as containerd itself times it: the same GPU pod, once marked for
// the plugin (which mounts the driver) and once in a namespace that did not
// opt in (no marker: the plugin answers at once), and NRI's latency of the
// plugin's CreateContainer. Figures are logged, for docs/benchmarks.md; only
// the plugin being called for each marked container is checked.
func TestContainerStartCost(t *testing.T) {
	needContainerd(t, "containerd's CRI and NRI timers")
	waitPluginReady(t)
	const n = 10
	marked := namespace(t, "baseline")
	plain := newNamespace(t, "nri-plain-", nil)
	batch := func(ns string, inject bool) (create, start, plugin timer) {
		c0, s0, p0 := containerdTimers(t)
		for i := range n {
			p := cudaPod(fmt.Sprintf("cost-%d", i))
			got := p
			if inject {
				got = createInjected(t, ns, p)
			} else if _, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				t.Fatalf("failed to create pod %s: %v", p.Name, err)
			}
			waitDone(t, ns, got.Name)
			// The GPU goes back to the device plugin only once the pod is gone.
			if err := client().CoreV1().Pods(ns).Delete(context.Background(), got.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("failed to delete pod %s: %v", got.Name, err)
			}
		}
		c1, s1, p1 := containerdTimers(t)
		return c1.minus(c0), s1.minus(s0), p1.minus(p0)
	}
	ic, is, ip := batch(marked, true)
	pc, ps, pp := batch(plain, false)
	if ip.count < n {
		t.Errorf("NRI timed gpu-injector's CreateContainer %v times for %d marked containers", ip.count, n)
	}
	t.Logf("%d containers each (containerd's own timers, means):", n)
	t.Logf("  marked, driver mounted by the plugin: create %.2f ms, start %.2f ms; the plugin's CreateContainer as NRI times it: %.3f ms mean, %v of %v within 5 ms",
		ic.meanMS(), is.meanMS(), ip.meanMS(), ip.under5ms, ip.count)
	t.Logf("  not marked (namespace not opted in): create %.2f ms, start %.2f ms; the plugin's CreateContainer: %.3f ms mean, %v of %v within 5 ms",
		pc.meanMS(), ps.meanMS(), pp.meanMS(), pp.under5ms, pp.count)
	t.Logf("  added by the plugin's mounts: create %+.2f ms, start %+.2f ms", ic.meanMS()-pc.meanMS(), is.meanMS()-ps.meanMS())
}

// The node's decisions: LD_LIBRARY_PATH from the image's ENV, the image's
// CUDA requirement against the node's driver, only GPUs get the driver, and
// its mounts read-only all the way down.

// importImage builds an image of files (container path -> host path) with
// env, and loads it into the kubelet node's runtime.
func importImage(t *testing.T, ref string, files map[string]string, env ...string) {
	t.Helper()
	tar, err := testEnv.Cluster.BuildImageWithConfig(ref, files, cluster.ImageConfig{Env: env})
	if err != nil {
		t.Fatalf("failed to build image %s: %v", ref, err)
	}
	if err := testEnv.Cluster.ImportImage(context.Background(), tar); err != nil {
		t.Fatalf("failed to import image %s: %v", ref, err)
	}
}

// cudaCheckFiles builds cuda-check and returns the files of an image that
// runs it, with glibc and the loader, and no driver file.
func cudaCheckFiles(t *testing.T) map[string]string {
	t.Helper()
	built, err := workloads.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range built {
		files[f.Dest] = f.Source
	}
	return files
}

// compile runs gcc on a C source in dir and returns the output's path.
func compile(t *testing.T, dir, out, src string, args ...string) string {
	t.Helper()
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, out)
	cmd := exec.Command("gcc", append([]string{"-O2", "-o", bin, c}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("failed to compile %s: %v\n%s", out, err, b)
	}
	return bin
}

// release deletes a pod, whose GPU goes back to the device plugin only
// once it is gone: the kubelet node has two.
func release(t *testing.T, ns, name string) {
	t.Helper()
	if err := client().CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("failed to delete pod %s/%s: %v", ns, name, err)
	}
}

// waitRefused waits for the pod's container to be refused at creation and
// returns the reason the kubelet shows.
func waitRefused(t *testing.T, ns, name string) string {
	t.Helper()
	var why string
	poll(t, runTimeout, "pod "+ns+"/"+name+"'s container to be refused", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("pod %s: %s", p.Status.Phase, podLog(t, ns, name, p.Spec.Containers[0].Name))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason == "CreateContainerError" {
				why = w.Message
				return true, nil
			}
		}
		return false, nil
	})
	return why
}

// TestImageEnvironment: an image whose ENV LD_LIBRARY_PATH names a folder
// of its own library runs a program that needs that library and the node's
// libcuda.so.1. The plugin reads LD_LIBRARY_PATH from the environment the
// runtime hands it and appends the driver's folder, so containerd must hand
// it the image's ENV: a plugin that saw only the pod's env would set the
// driver's folder alone, and the loader would not find libapp.so.
func TestImageEnvironment(t *testing.T) {
	waitPluginReady(t)
	built, err := workloads.BuildAppCheck(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range built {
		files[f.Dest] = f.Source
	}
	const ref = "gpu-injector.local/e2e/app-env:v1"
	importImage(t, ref, files, "PATH=/usr/local/nvidia/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/opt/app/lib")
	appPod := func() *corev1.Pod {
		p := cudaPod("app")
		p.Spec.Containers[0].Name = "app"
		p.Spec.Containers[0].Image = ref
		p.Spec.Containers[0].Command = []string{workloads.AppCheck}
		return p
	}
	check := func(t *testing.T, ns, name string) {
		t.Helper()
		defer release(t, ns, name)
		done := waitDone(t, ns, name)
		log := podLog(t, ns, name, "app")
		if done.Status.Phase != corev1.PodSucceeded {
			t.Fatalf("pod %s:\n%s", done.Status.Phase, log)
		}
		for _, want := range []string{
			"LD_LIBRARY_PATH=/opt/app/lib:/usr/local/nvidia/lib64\n",
			"libapp: 42\n",
			"loaded libcuda.so.1 from /usr/local/nvidia/lib64/libcuda.so.1\n",
		} {
			if !strings.Contains(log, want) {
				t.Errorf("app-check log:\n%s\nwant %q", log, want)
			}
		}
	}

	// The plugin alone: a namespace the webhook does not serve, the marker
	// written by hand, nothing in the pod's env.
	t.Run("the plugin", func(t *testing.T) {
		ns := newNamespace(t, "nri-plain-", nil)
		p := appPod()
		p.Annotations = map[string]string{layout.AnnotationRuntimeInject: "app"}
		created, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("failed to create the pod: %v", err)
		}
		if env := created.Spec.Containers[0].Env; len(env) != 0 {
			t.Fatalf("the pod has env %v; this case is about the image's alone", env)
		}
		check(t, ns, created.Name)
	})
	// Through the webhook, which leaves LD_LIBRARY_PATH to the plugin for
	// a container the driver reaches at the runtime.
	t.Run("the webhook and the plugin", func(t *testing.T) {
		ns := namespace(t, "baseline")
		p := createInjected(t, ns, appPod())
		assertRuntimeInjected(t, p, "app")
		for _, e := range p.Spec.Containers[0].Env {
			if e.Name == "LD_LIBRARY_PATH" {
				t.Errorf("the webhook wrote LD_LIBRARY_PATH=%q into the pod, which replaces the image's", e.Value)
			}
		}
		check(t, ns, p.Name)
	})
}

// TestCUDARequirement: an image whose NVIDIA_REQUIRE_CUDA asks for a CUDA
// newer than the node's driver offers is not created, and the reason names
// the requirement, the node's driver and CUDA version and the label that
// selects nodes that satisfy it; one within it runs, steered by that label;
// the one too new runs with NVIDIA_DISABLE_REQUIRE=true in the pod's env.
func TestCUDARequirement(t *testing.T) {
	waitPluginReady(t)
	kn := testEnv.KubeletNode()
	code, err := standin.CUDADriverVersion(kn.DriverVersion)
	if err != nil {
		t.Fatal(err)
	}
	cuda := fmt.Sprintf("%d.%d", code/1000, code%1000/10)
	node, err := client().CoreV1().Nodes().Get(context.Background(), kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Labels[layout.LabelCUDADriverVersion]; got != cuda {
		t.Fatalf("%s=%q, want the stand-in's %s", layout.LabelCUDADriverVersion, got, cuda)
	}
	if got := node.Labels[layout.LabelCUDADriverVersionNumber]; got != strconv.Itoa(code) {
		t.Fatalf("%s=%q, want %d", layout.LabelCUDADriverVersionNumber, got, code)
	}
	files := cudaCheckFiles(t)
	tooNew := fmt.Sprintf("cuda>=%d.0 brand=tesla,driver>=470,driver<471", code/1000+1)
	within := "cuda>=" + cuda + " brand=tesla,driver>=470,driver<471"
	const newRef, okRef = "gpu-injector.local/e2e/cuda-too-new:v1", "gpu-injector.local/e2e/cuda-within:v1"
	path := "PATH=/usr/local/nvidia/bin:/usr/bin:/bin"
	importImage(t, newRef, files, path, "NVIDIA_REQUIRE_CUDA="+tooNew)
	importImage(t, okRef, files, path, "NVIDIA_REQUIRE_CUDA="+within)
	ns := namespace(t, "baseline")
	pod := func(name, ref string) *corev1.Pod {
		p := cudaPod(name)
		p.Spec.Containers[0].Image = ref
		return p
	}

	t.Run("too new", func(t *testing.T) {
		p := createInjected(t, ns, pod("too-new", newRef))
		why := waitRefused(t, ns, p.Name)
		t.Logf("refused: %s", why)
		for _, want := range []string{
			"NVIDIA_REQUIRE_CUDA", fmt.Sprintf("cuda>=%d.0", code/1000+1),
			"driver " + kn.DriverVersion + " (CUDA " + cuda + ")",
			fmt.Sprintf("%s Gt %d", layout.LabelCUDADriverVersionNumber, (code/1000+1)*1000-1),
			"NVIDIA_DISABLE_REQUIRE=true",
		} {
			if !strings.Contains(why, want) {
				t.Errorf("the reason does not say %q", want)
			}
		}
		release(t, ns, p.Name)
	})
	t.Run("within, steered by the label", func(t *testing.T) {
		p := pod("within", okRef)
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: layout.LabelCUDADriverVersionNumber, Operator: corev1.NodeSelectorOpGt, Values: []string{strconv.Itoa(code - 1)},
				}},
			}}},
		}}
		p = createInjected(t, ns, p)
		defer release(t, ns, p.Name)
		d := waitDone(t, ns, p.Name)
		log := podLog(t, ns, p.Name, "cuda")
		if d.Status.Phase != corev1.PodSucceeded {
			t.Fatalf("pod %s:\n%s", d.Status.Phase, log)
		}
		assertSawDriver(t, log, kn.DriverVersion)
	})
	t.Run("too new, check disabled", func(t *testing.T) {
		p := pod("disabled", newRef)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_DISABLE_REQUIRE", Value: "true"}}
		p = createInjected(t, ns, p)
		defer release(t, ns, p.Name)
		d := waitDone(t, ns, p.Name)
		log := podLog(t, ns, p.Name, "cuda")
		if d.Status.Phase != corev1.PodSucceeded {
			t.Fatalf("pod %s:\n%s", d.Status.Phase, log)
		}
		assertSawDriver(t, log, kn.DriverVersion)
	})
}

// TestBlockDeviceAtNvidia0: a CPU container with a raw block volume at
// /dev/nvidia0 (volumeDevices, which Pod Security's restricted level allows)
// and a marker written by hand gets no driver; the plugin logs why.
func TestBlockDeviceAtNvidia0(t *testing.T) {
	waitPluginReady(t)
	kn := testEnv.KubeletNode()
	backing := filepath.Join(t.TempDir(), "block")
	if err := os.WriteFile(backing, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Fatalf("failed to attach a loop device: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", loop).CombinedOutput(); err != nil {
			t.Errorf("failed to detach %s: %v: %s", loop, err, out)
		}
	})
	ns := newNamespace(t, "nri-plain-", nil)
	block := corev1.PersistentVolumeBlock
	pvName := ns + "-block"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &block,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "gpu-injector-e2e-block",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: loop}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{kn.Name}}},
			}}}},
		},
	}
	if _, err := client().CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create the block volume: %v", err)
	}
	t.Cleanup(func() {
		_ = client().CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	class := "gpu-injector-e2e-block"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "block"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &block,
			StorageClassName: &class, VolumeName: pvName,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := client().CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create the claim: %v", err)
	}
	no := false
	c := container("cpu", gpu, workloads.CUDACheck)
	c.Resources = corev1.ResourceRequirements{}
	c.VolumeDevices = []corev1.VolumeDevice{{Name: "block", DevicePath: "/dev/nvidia0"}}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "block-at-nvidia0", Annotations: map[string]string{layout.AnnotationRuntimeInject: "cpu"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no, Containers: []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "block", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "block"}}}}},
	}
	if _, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create the pod: %v", err)
	}
	d := waitDone(t, ns, p.Name)
	log := podLog(t, ns, p.Name, "cpu")
	t.Logf("cuda-check in a CPU container with a block device at /dev/nvidia0:\n%s", log)
	if d.Spec.NodeName != kn.Name {
		t.Fatalf("ran on %q, want %s", d.Spec.NodeName, kn.Name)
	}
	if !strings.Contains(log, "devices: /dev/nvidia0\n") {
		t.Errorf("the container did not have the block device at /dev/nvidia0 alone")
	}
	if d.Status.Phase != corev1.PodFailed || !strings.Contains(log, "cannot load libcuda.so.1") {
		t.Errorf("pod %s: the container got the driver", d.Status.Phase)
	}
	// The plugin says why, naming the device's type.
	pods, err := client().CoreV1().Pods(env.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + kn.Name})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for i := range pods.Items {
		for _, pc := range pods.Items[i].Spec.Containers {
			if pc.Name != "nri-plugin" {
				continue
			}
			for _, line := range strings.Split(testEnv.PodLog(context.Background(), &pods.Items[i], "nri-plugin", false, 0), "\n") {
				if strings.Contains(line, "holds another device") && strings.Contains(line, ns+"/"+p.Name) && strings.Contains(line, `"type":"b"`) {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no line of the plugin's log says it refused the block device of %s/%s", ns, p.Name)
	}
}

// rwCheckSource reads a marker in a folder and tries to create a file
// there: what a container can do to a mount below a driver folder.
const rwCheckSource = `#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
	char path[4096], buf[64] = {0};
	int fd;
	if (argc != 2) return 2;
	snprintf(path, sizeof(path), "%s/marker", argv[1]);
	fd = open(path, O_RDONLY);
	if (fd < 0) {
		printf("marker: %s\n", strerror(errno));
	} else {
		if (read(fd, buf, sizeof(buf) - 1) < 0) buf[0] = 0;
		printf("marker: %s\n", buf);
		close(fd);
	}
	snprintf(path, sizeof(path), "%s/created", argv[1]);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	printf("create: %s\n", fd < 0 ? strerror(errno) : "ok");
	return 0;
}
`

// TestSubmountReadOnly: a writable mount below a driver folder the plugin
// mounts (a tmpfs anyone may write) stays read-only in the container: the
// whole tree with rro where the kernel has it, or absent, with binds that
// carry no submount, where it does not.
func TestSubmountReadOnly(t *testing.T) {
	waitPluginReady(t)
	kn := testEnv.KubeletNode()
	node, err := client().CoreV1().Nodes().Get(context.Background(), kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := layout.Decode(node.Annotations[layout.AnnotationLayout])
	if err != nil {
		t.Fatalf("the kubelet node's layout: %v", err)
	}
	var folder *layout.Mount
	for i, m := range plan.Mounts {
		if m.Kind == layout.KindDirectory {
			folder = &plan.Mounts[i]
			break
		}
	}
	if folder == nil {
		t.Fatalf("the kubelet node's plan mounts no folder: %+v", plan.Mounts)
	}
	// Mounted in the node's mount namespace, where containerd binds it, and
	// writable there by anyone: only a read-only mount can refuse. The folder
	// is made where this process finds the node's driver.
	sub := filepath.Join(kn.HostRoot, folder.HostPath, "gpu-injector-e2e-submount")
	made := filepath.Join(kn.DriverRoot(), folder.HostPath, "gpu-injector-e2e-submount")
	if err := os.Mkdir(made, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(made) })
	inNode := func(bin string, args ...string) {
		t.Helper()
		if _, err := testEnv.Cluster.InNodeNamespace(context.Background(), bin, args...); err != nil {
			t.Fatal(err)
		}
	}
	inNode("mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "gpu-injector-e2e", sub)
	t.Cleanup(func() {
		if _, err := testEnv.Cluster.InNodeNamespace(context.Background(), "umount", sub); err != nil {
			t.Error(err)
		}
	})
	inNode("sh", "-c", "printf submount > "+filepath.Join(sub, "marker"))
	bin := compile(t, t.TempDir(), "rw-check", rwCheckSource, "-static")
	const ref = "gpu-injector.local/e2e/rw-check:v1"
	importImage(t, ref, map[string]string{"/rw-check": bin})
	ns := namespace(t, "baseline")
	p := cudaPod("submount")
	p.Spec.Containers[0].Image = ref
	p.Spec.Containers[0].Command = []string{"/rw-check", path.Join(folder.ContainerPath, "gpu-injector-e2e-submount")}
	p = createInjected(t, ns, p)
	defer release(t, ns, p.Name)
	assertRuntimeInjected(t, p, "cuda")
	d := waitDone(t, ns, p.Name)
	log := podLog(t, ns, p.Name, "cuda")
	t.Logf("rw-check on %s:\n%s", folder.ContainerPath, log)
	if d.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s", d.Status.Phase)
	}
	if out, err := testEnv.Cluster.InNodeNamespace(context.Background(), "ls", "-A", sub); err != nil || string(out) != "marker\n" {
		t.Errorf("the submount holds %q (%v), want the marker alone", out, err)
	}
	if !strings.Contains(log, "create: Read-only file system\n") {
		t.Errorf("the container could write below %s", folder.ContainerPath)
	}
	rro, kernel := nriplugin.KernelHasRecursiveReadOnly()
	want := "marker: submount\n"
	if !rro {
		want = "marker: No such file or directory\n"
	}
	if !strings.Contains(log, want) {
		t.Errorf("kernel %s (recursive read-only: %v): want %q", kernel, rro, want)
	}
}
