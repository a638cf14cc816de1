//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

// TestNamespaceOptIn: the same GPU pod, on the kubelet node, in a namespace
// without the opt-in label and in one with it. Unlabelled, the API server
// never calls the webhook: the pod is unchanged and its container cannot load
// libcuda.so.1. Labelled, the pod gets the node's driver and loads it.
func TestNamespaceOptIn(t *testing.T) {
	kn := testEnv.KubeletNode()
	onKubelet := map[string]string{env.LabelAccelerator: kn.Accelerator}

	t.Run("unlabelled namespace: unchanged, and the driver is missing", func(t *testing.T) {
		ns := newNamespace(t, false)
		want := gpuPod("cuda-check", podOpts{resource: gpu, nodeSelector: onKubelet})
		p := createPod(t, ns, want)
		assertUntouched(t, p, want)
		done := waitPodDone(t, ns, p.Name)
		if done.Spec.NodeName != kn.Name {
			t.Fatalf("pod ran on %q, want the kubelet node %s", done.Spec.NodeName, kn.Name)
		}
		log := podLog(t, ns, p.Name, "cuda")
		if done.Status.Phase != corev1.PodFailed || !strings.Contains(log, "cannot open shared object file") {
			t.Fatalf("pod %s: phase %s, log:\n%s\nwant Failed with \"cannot open shared object file\"", p.Name, done.Status.Phase, log)
		}
	})

	t.Run("labelled namespace: mutated, and the container loads the node's libcuda", func(t *testing.T) {
		ns := newNamespace(t, true)
		p := createPod(t, ns, gpuPod("cuda-check", podOpts{resource: gpu, nodeSelector: onKubelet}))
		assertInjected(t, p, kn)
		done := waitPodDone(t, ns, p.Name)
		log := podLog(t, ns, p.Name, "cuda")
		want := fmt.Sprintf("loaded libcuda.so.1 from /usr/local/nvidia/lib64/libcuda.so.1 driver=%s", kn.DriverVersion)
		if done.Status.Phase != corev1.PodSucceeded || !strings.Contains(log, want) || !strings.Contains(log, standin.Notice) {
			t.Fatalf("pod %s: phase %s, log:\n%s\nwant Succeeded with %q and the stand-in notice", p.Name, done.Status.Phase, log, want)
		}
		assertDevicePluginGave(t, log)
	})
}

// assertDevicePluginGave checks cuda-check's report of what NVIDIA's device
// plugin gave its container: one GPU's device node, the control and UVM nodes
// (--pass-device-specs), and the GPU's UUID in NVIDIA_VISIBLE_DEVICES.
func assertDevicePluginGave(t *testing.T, log string) {
	t.Helper()
	devices, visible := "", ""
	for _, line := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(line, "devices:"); ok {
			devices = v
		}
		if v, ok := strings.CutPrefix(line, "NVIDIA_VISIBLE_DEVICES="); ok {
			visible = v
		}
	}
	got := strings.Fields(devices)
	gpus := 0
	for _, d := range got {
		if strings.TrimLeft(strings.TrimPrefix(d, "/dev/nvidia"), "0123456789") == "" && d != "/dev/nvidia" {
			gpus++
		}
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if !slices.Contains(got, want) {
			t.Errorf("the container has device nodes %v, want %s among them (NVIDIA's device plugin, --pass-device-specs)", got, want)
		}
	}
	if gpus != 1 || !strings.HasPrefix(visible, "GPU-5354414e-") || strings.Contains(visible, ",") {
		t.Errorf("the container has device nodes %v and NVIDIA_VISIBLE_DEVICES=%q, want one GPU node and one stand-in GPU's UUID", got, visible)
	}
}

// legacyJob is the classic nvidia-smi Job of the Kubernetes 1.6-1.9 GPU
// tutorials (hack/gpu/cluster/nvidia-smi-job.yaml) on our driverless image, with a
// second container that reports which libcuda.so.1 it loaded. It names the
// legacy resource and no node: neither a node selector nor driver volumes.
func legacyJob() *batchv1.Job {
	limits := corev1.ResourceList{legacyGPU: resource.MustParse("1")}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "nvidia-smi"},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr(int32(0)),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr(false),
					Containers: []corev1.Container{
						{Name: "nvidia-smi", Image: env.WorkloadImage, ImagePullPolicy: corev1.PullNever,
							Command:         []string{"/usr/local/nvidia/bin/nvidia-smi"},
							Resources:       corev1.ResourceRequirements{Limits: limits},
							SecurityContext: restrictedContext()},
						{Name: "cuda-check", Image: env.WorkloadImage, ImagePullPolicy: corev1.PullNever,
							Command:         []string{workloads.CUDACheck},
							Resources:       corev1.ResourceRequirements{Limits: limits},
							SecurityContext: restrictedContext()},
					},
				},
			},
		},
	}
}

// gpuJob is legacyJob's cuda-check container alone, asking for nvidia.com/gpu,
// pinned to the kubelet node by its accelerator so that it runs.
func gpuJob(accelerator string) *batchv1.Job {
	j := legacyJob()
	j.Name = "cuda-check"
	spec := &j.Spec.Template.Spec
	spec.Containers = spec.Containers[1:]
	spec.Containers[0].Resources.Limits = corev1.ResourceList{gpu: resource.MustParse("1")}
	spec.NodeSelector = map[string]string{env.LabelAccelerator: accelerator}
	return j
}

// jobPod waits for the Job controller's pod of a Job and returns it; when
// none comes, the failure quotes the namespace's events (a refused create is
// a FailedCreate event of the Job).
func jobPod(t *testing.T, ns, job string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("failed waiting %s for the pod of job %s/%s: %v; the namespace's events:\n%s", apiTimeout, ns, job, err, namespaceEvents(ns))
	}
	return pod
}

// namespaceEvents lists a namespace's events, one a line, oldest first.
func namespaceEvents(ns string) string {
	evs, err := client().CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return "(failed to list events: " + err.Error() + ")"
	}
	items := evs.Items
	slices.SortStableFunc(items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	var b strings.Builder
	for _, e := range items {
		fmt.Fprintf(&b, "%s %s %s/%s: %s: %s\n", e.LastTimestamp.Format(time.RFC3339), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

// TestLegacyNvidiaSMIJob: the classic Job, created as a Job. The Job has no
// node selector on purpose: it is the tutorial's manifest, and the layout
// choice is the configured policy's (MostGPUs): the kubelet node offers 2
// GPUs (NVIDIA's device plugin on the stand-in), each API-only node 1, so the
// webhook picks the kubelet node's layout
// and the fingerprint selector sends the pod there, where the kubelet runs it.
func TestLegacyNvidiaSMIJob(t *testing.T) {
	if bad := env.DriverFiles(testEnv.ImageFiles); len(bad) > 0 {
		t.Fatalf("the workload image holds driver files %v", bad)
	}
	kn := testEnv.KubeletNode()

	t.Run("labelled namespace: mutated, bound to the matching node, run by the kubelet", func(t *testing.T) {
		ns := newNamespace(t, true)
		p := createLegacyJob(t, ns)
		assertInjected(t, p, kn)
		smi, check := legacyJobRan(t, ns, p, kn)
		t.Logf("nvidia-smi said:\n%s\ncuda-check said:\n%s", smi, check)
	})

	t.Run("unlabelled namespace: Pending forever on the legacy resource", func(t *testing.T) {
		ns := newNamespace(t, false)
		if _, err := client().BatchV1().Jobs(ns).Create(testContext(t), legacyJob(), metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create the job: %v", err)
		}
		p := jobPod(t, ns, "nvidia-smi")
		t.Cleanup(func() {
			_ = client().BatchV1().Jobs(ns).Delete(context.Background(), "nvidia-smi", metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationBackground)})
		})
		if _, ok := p.Spec.Containers[0].Resources.Limits[legacyGPU]; !ok {
			t.Fatalf("pod limits %v, want the legacy %s untouched", p.Spec.Containers[0].Resources.Limits, legacyGPU)
		}
		msg := waitEvent(t, ns, p.Name, "FailedScheduling", "Insufficient "+string(legacyGPU))
		t.Logf("scheduler: %s", msg)
		now, err := client().CoreV1().Pods(ns).Get(testContext(t), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("failed to get pod: %v", err)
		}
		if now.Spec.NodeName != "" || now.Status.Phase != corev1.PodPending {
			t.Fatalf("pod is on %q in phase %s, want unbound and Pending", now.Spec.NodeName, now.Status.Phase)
		}
	})

	t.Run("unlabelled namespace, nvidia.com/gpu: runs without the driver", func(t *testing.T) {
		ns := newNamespace(t, false)
		if _, err := client().BatchV1().Jobs(ns).Create(testContext(t), gpuJob(kn.Accelerator), metav1.CreateOptions{}); err != nil {
			t.Fatalf("failed to create the job: %v", err)
		}
		p := jobPod(t, ns, "cuda-check")
		if _, ok := p.Annotations[layout.AnnotationInjected]; ok || len(hostPaths(p)) > 0 {
			t.Fatalf("pod in an unlabelled namespace was mutated: %v, volumes %v", p.Annotations, hostPaths(p))
		}
		done := waitPodDone(t, ns, p.Name)
		log := podLog(t, ns, p.Name, "cuda-check")
		if done.Spec.NodeName != kn.Name || done.Status.Phase != corev1.PodFailed || !strings.Contains(log, "cannot open shared object file") {
			t.Fatalf("pod on %q, phase %s, log:\n%s\nwant Failed on %s with \"cannot open shared object file\"", done.Spec.NodeName, done.Status.Phase, log, kn.Name)
		}
		t.Logf("cuda-check said: %s", strings.TrimSpace(log))
	})
}

// TestLegacyJobOnTaintedGPUNode: GKE taints its GPU nodes
// nvidia.com/gpu=present:NoSchedule and relies on the ExtendedResourceToleration
// admission plugin to tolerate it for pods that request nvidia.com/gpu; the
// plugin sees the legacy name, no extended resource, and adds nothing. With
// the kubelet node tainted so, the classic Job is renamed, given the
// toleration the plugin gives nvidia.com/gpu, injected with that node's
// layout and run there. This API server runs no ExtendedResourceToleration,
// so a modern pod without the toleration fits no known node: it is admitted
// for a node that will (the runtime's marker, no pin), with the taint and the
// fix in its warning.
func TestLegacyJobOnTaintedGPUNode(t *testing.T) {
	kn := testEnv.KubeletNode()
	gpuTaint := corev1.Taint{Key: string(gpu), Value: "present", Effect: corev1.TaintEffectNoSchedule}
	ns := newNamespace(t, true)
	// A server-side dry run goes through the webhook and creates nothing: it
	// says when the webhook's node index has seen the taint come and go.
	probe := gpuPod("taint-probe", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: kn.Accelerator}})
	// The dry run's warnings say when no known node fits it.
	dryRun := func(ctx context.Context) (string, error) {
		w := &warningRecorder{}
		_, err := warningClient(t, w).CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return w.all(), err
	}
	setGPUTaint(t, kn.Name, gpuTaint, true)
	t.Cleanup(func() {
		setGPUTaint(t, kn.Name, gpuTaint, false)
		waitFor(t, apiTimeout, "the webhook to fit pods to "+kn.Name+" again", func(ctx context.Context) (bool, error) {
			warnings, err := dryRun(ctx)
			return err == nil && !strings.Contains(warnings, gpuTaint.ToString()), nil
		})
	})
	var denial string
	waitFor(t, apiTimeout, "the webhook to warn a pod of the taint of "+kn.Name, func(ctx context.Context) (bool, error) {
		warnings, err := dryRun(ctx)
		if err == nil && strings.Contains(warnings, gpuTaint.ToString()) {
			denial = warnings
			return true, nil
		}
		return false, nil
	})
	for _, want := range []string{
		"the pod does not tolerate (add the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule} to the pod",
		"or enable the API server's ExtendedResourceToleration admission plugin",
	} {
		if !strings.Contains(denial, want) {
			t.Errorf("warning of a pod without the toleration:\n%s\nwant %q", denial, want)
		}
	}
	t.Logf("a modern pod without the toleration: %s", denial)

	p := createLegacyJob(t, ns)
	n := 0
	for _, tol := range p.Spec.Tolerations {
		if tol.Key == string(gpu) {
			n++
			if tol.Operator != corev1.TolerationOpExists || tol.Effect != corev1.TaintEffectNoSchedule || tol.Value != "" {
				t.Errorf("toleration %+v, want {key: %s, operator: Exists, effect: NoSchedule}", tol, gpu)
			}
		}
	}
	if n != 1 {
		t.Errorf("pod has %d tolerations of %s, want 1: %+v", n, gpu, p.Spec.Tolerations)
	}
	assertInjected(t, p, kn)
	legacyJobRan(t, ns, p, kn)
}

// createLegacyJob creates the classic nvidia-smi Job in ns and returns its
// pod, checked renamed: no container asks for the legacy resource, each asks
// for one nvidia.com/gpu.
func createLegacyJob(t *testing.T, ns string) *corev1.Pod {
	t.Helper()
	if _, err := client().BatchV1().Jobs(ns).Create(testContext(t), legacyJob(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("failed to create the job: %v", err)
	}
	p := jobPod(t, ns, "nvidia-smi")
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Limits[legacyGPU]; ok {
			t.Errorf("container %s still asks for %s: %v", c.Name, legacyGPU, c.Resources.Limits)
		}
		if q := c.Resources.Limits[gpu]; q.Value() != 1 {
			t.Errorf("container %s limits %v, want %s: 1", c.Name, c.Resources.Limits, gpu)
		}
	}
	return p
}

// legacyJobRan waits for the classic nvidia-smi Job of pod p to finish and
// checks that it ran on node kn and saw kn's driver: nvidia-smi's version
// and the stand-in's notice, cuda-check's libcuda from the injected mount.
// It returns both containers' logs.
func legacyJobRan(t *testing.T, ns string, p *corev1.Pod, kn *env.Node) (smi, check string) {
	t.Helper()
	var job *batchv1.Job
	waitFor(t, runTimeout, "job "+ns+"/nvidia-smi to finish", func(ctx context.Context) (bool, error) {
		j, err := client().BatchV1().Jobs(ns).Get(ctx, "nvidia-smi", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		job = j
		return j.Status.Succeeded > 0 || j.Status.Failed > 0, nil
	})
	done, err := client().CoreV1().Pods(ns).Get(testContext(t), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("failed to get pod %s: %v", p.Name, err)
	}
	if done.Spec.NodeName != kn.Name {
		t.Errorf("pod ran on %q, want %s", done.Spec.NodeName, kn.Name)
	}
	smi = podLog(t, ns, p.Name, "nvidia-smi")
	check = podLog(t, ns, p.Name, "cuda-check")
	if job.Status.Succeeded != 1 {
		t.Fatalf("job failed; nvidia-smi log:\n%s\ncuda-check log:\n%s", smi, check)
	}
	if want := "Driver Version: " + kn.DriverVersion; !strings.Contains(smi, want) || !strings.Contains(smi, standin.Notice) {
		t.Errorf("nvidia-smi log:\n%s\nwant %q and the stand-in notice", smi, want)
	}
	if want := fmt.Sprintf("from /usr/local/nvidia/lib64/libcuda.so.1 driver=%s", kn.DriverVersion); !strings.Contains(check, want) {
		t.Errorf("cuda-check log:\n%s\nwant %q", check, want)
	}
	return smi, check
}

// setGPUTaint puts the taint on the node, or takes it off.
func setGPUTaint(t *testing.T, node string, taint corev1.Taint, on bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client().CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, tn := range n.Spec.Taints {
			if tn.Key != taint.Key || tn.Effect != taint.Effect {
				taints = append(taints, tn)
			}
		}
		if on {
			taints = append(taints, taint)
		}
		n.Spec.Taints = taints
		_, err = client().CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("failed to set taint %s on node %s to %v: %v", taint.ToString(), node, on, err)
	}
}

// TestAcceleratorSelectsLayout: a pod that selects a GPU model gets the
// layout of the nodes with that model, their host paths, and is bound there
// by the scheduler. The API-only nodes have no kubelet, so the pod never
// runs: spec.nodeName is the proof.
func TestAcceleratorSelectsLayout(t *testing.T) {
	ns := newNamespace(t, true)
	for name, tc := range map[string]struct {
		node     string
		hostPath string
	}{
		"k80 gets Ubuntu nvidia-384": {node: "ubuntu-k80", hostPath: "/usr/lib/nvidia-384"},
		"p100 gets CentOS 7":         {node: "centos-p100", hostPath: "/usr/lib64/nvidia"},
		"t4 gets GKE":                {node: testEnv.KubeletNode().Name, hostPath: "/home/kubernetes/bin/nvidia"},
	} {
		t.Run(name, func(t *testing.T) {
			n := testEnv.Node(tc.node)
			p := createPod(t, ns, gpuPod("select-"+n.Accelerator, podOpts{
				resource:     gpu,
				nodeSelector: map[string]string{env.LabelAccelerator: n.Accelerator},
			}))
			assertInjected(t, p, n)
			var found bool
			for _, hp := range hostPaths(p) {
				if hp == tc.hostPath || strings.HasPrefix(hp, tc.hostPath+"/") {
					found = true
				}
			}
			if !found {
				t.Errorf("hostPaths %v, want one under %s", hostPaths(p), tc.hostPath)
			}
			if bound := waitBound(t, ns, p.Name); bound.Spec.NodeName != n.Name {
				t.Errorf("pod bound to %q, want %s", bound.Spec.NodeName, n.Name)
			}
		})
	}
}

// TestNoKnownNodeFits: with the chart's default values, a GPU pod whose
// constraints no ready GPU node satisfies (a pool at zero: no node of that
// accelerator exists yet) is admitted, not denied, so that an autoscaler can
// add the node it waits for: kubectl shows the webhook's warning, the pod
// exists with the runtime's marker and NRI's required-plugins annotation,
// no hostPath volume and no pin on a label of the probe, and stays Pending.
func TestNoKnownNodeFits(t *testing.T) {
	ns := newNamespace(t, true)
	manifest := `apiVersion: v1
kind: Pod
metadata:
  name: wants-a-v100
spec:
  restartPolicy: Never
  nodeSelector:
    accelerator: nvidia-tesla-v100
  containers:
  - name: cuda
    image: ` + env.WorkloadImage + `
    imagePullPolicy: Never
    resources:
      limits:
        nvidia.com/gpu: 1
`
	stdout, stderr, err := kubectl(t, manifest, "create", "-n", ns, "-f", "-")
	if err != nil {
		t.Fatalf("kubectl create failed, want the pod admitted: %v\n%s", err, stderr)
	}
	for _, want := range []string{"Warning: gpu-injector: no ready GPU node fits this pod yet", "admitted for a node that will"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("kubectl stderr:\n%s\nwant %q", stderr, want)
		}
	}
	t.Logf("kubectl said: %s%s", strings.TrimSpace(stdout), strings.TrimSpace(stderr))
	p, err := client().CoreV1().Pods(ns).Get(testContext(t), "wants-a-v100", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the admitted pod: %v", err)
	}
	if p.Annotations[layout.AnnotationRuntimeInject] != "cuda" || p.Annotations["required-plugins.noderesource.dev/container.cuda"] == "" {
		t.Errorf("annotations %v, want the runtime's marker and required plugins", p.Annotations)
	}
	if hp := hostPaths(p); len(hp) > 0 {
		t.Errorf("hostPath volumes %v in a pod no known node fits", hp)
	}
	for k := range p.Spec.NodeSelector {
		if strings.HasPrefix(k, layout.Prefix) {
			t.Errorf("nodeSelector %v pins on a label of the probe, which no autoscaler's node template carries", p.Spec.NodeSelector)
		}
	}
	waitFor(t, apiTimeout, "the pod to be Unschedulable", func(ctx context.Context) (bool, error) {
		got, err := client().CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
}

// TestProbesPublishLayouts: each probe, the real binary with a node-bound
// token, read its node's stand-in driver through go-nvml (the kubelet node's
// from the real /home/kubernetes/bin/nvidia, the others from their fake
// roots) and published the layout of that node's classic paths.
func TestProbesPublishLayouts(t *testing.T) {
	for name, tc := range map[string]struct {
		node      string
		hostPaths []string
	}{
		"GKE on the kubelet node": {node: testEnv.KubeletNode().Name, hostPaths: []string{"/home/kubernetes/bin/nvidia/bin", "/home/kubernetes/bin/nvidia/lib64"}},
		"Ubuntu nvidia-384":       {node: "ubuntu-k80", hostPaths: []string{"/usr/lib/nvidia-384/bin", "/usr/lib/nvidia-384"}},
		"CentOS 7":                {node: "centos-p100", hostPaths: []string{"/usr/bin/nvidia-smi", "/usr/lib64/nvidia"}},
	} {
		t.Run(name, func(t *testing.T) {
			n := testEnv.Node(tc.node)
			node, err := client().CoreV1().Nodes().Get(testContext(t), n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("failed to get node: %v", err)
			}
			for k, want := range map[string]string{
				layout.LabelState:         layout.StateReady,
				layout.LabelDriverVersion: n.DriverVersion,
				layout.LabelGPUCount:      fmt.Sprint(standin.DeviceCount),
				layout.LabelGPUProduct:    "Stand-in-GPU-not-real",
			} {
				if got := node.Labels[k]; got != want {
					t.Errorf("label %s=%q, want %q", k, got, want)
				}
			}
			// The version came from NVML, not from file names.
			if got := node.Annotations[layout.Prefix+"driver-version-source"]; got != "NVML" {
				t.Errorf("driver version source %q, want NVML", got)
			}
			plan, err := layout.Decode(node.Annotations[layout.AnnotationLayout])
			if err != nil {
				t.Fatalf("failed to decode the layout: %v", err)
			}
			var got []string
			for _, m := range plan.Mounts {
				got = append(got, m.HostPath)
			}
			if strings.Join(got, ",") != strings.Join(tc.hostPaths, ",") {
				t.Errorf("layout host paths %v, want %v", got, tc.hostPaths)
			}
			if fp := node.Labels[layout.LabelFingerprint]; fp != plan.Fingerprint() {
				t.Errorf("fingerprint label %s, want the plan's %s", fp, plan.Fingerprint())
			}
		})
	}
}

// TestGKEDevicePluginNode: on GKE, the nvidia-gpu-device-plugin mounts the
// driver itself (its Allocate answer puts /home/kubernetes/bin/nvidia at
// /usr/local/nvidia in every container that gets a GPU). An API-only node
// publishes exactly what the probe publishes on such a host (the fake root
// gke-cos-device-plugin: the plugin's socket and process):
// runtimeInjection device-plugin, no mounts, and the folder the plugin's
// mount puts the libraries in as its library path. A GPU pod sent there gets
// the runtime's marker, no pin, no volume and no mount, which would land on
// the plugin's; the LD_LIBRARY_PATH with that folder, which the plugin does
// not set, comes from gpu-injector's NRI plugin at the container's creation
// (nriplugin's TestCreateContainerDevicePluginNode); GKE's own classic recipe,
// the installer's folder mounted by hand at /usr/local/nvidia, loses that
// mount and keeps the rest.
func TestGKEDevicePluginNode(t *testing.T) {
	ctx := testContext(t)
	root := t.TempDir()
	if _, err := fakeroot.Build(root, "gke-cos-device-plugin"); err != nil {
		t.Fatal(err)
	}
	res, err := nodeprobe.Probe(nodeprobe.ProbeOptions{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Ready() || res.Plan.RuntimeInjection != layout.RuntimeDevicePlugin || len(res.Plan.Mounts) != 0 || !slices.Equal(res.Plan.LibraryPaths, []string{"/usr/local/nvidia/lib64"}) {
		t.Fatalf("the probe on GKE's device-plugin node: %s, plan %+v, evidence %v", res.Reason(), res.Plan, res.Evidence)
	}
	pub, err := nodeprobe.Desired(res)
	if err != nil {
		t.Fatal(err)
	}
	const nodeName = "gke-device-plugin-l4"
	fp := apiGPUNode(t, nodeName, "nvidia-l4-gke", *res.Plan, 2)
	if fp != pub.Labels[layout.LabelFingerprint] {
		t.Fatalf("node %s carries fingerprint %s, the probe publishes %s", nodeName, fp, pub.Labels[layout.LabelFingerprint])
	}
	if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{nodeName: fp}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, true)
	onNode := map[string]string{env.LabelAccelerator: "nvidia-l4-gke"}

	t.Run("one pool, without mounts", func(t *testing.T) {
		p := gpuPod("cuda-check", podOpts{resource: gpu, nodeSelector: onNode})
		p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		got := createPod(t, ns, p)
		assertOnePool(t, got, fp)
		if len(hostPaths(got)) != 0 || len(got.Spec.Containers[0].VolumeMounts) != 0 {
			t.Errorf("pod %s got volumes %v and mounts %v, want none", got.Name, hostPaths(got), got.Spec.Containers[0].VolumeMounts)
		}
		waitBoundTo(t, ns, got.Name, nodeName)
	})

	t.Run("GKE's classic recipe loses its hand-written driver mount", func(t *testing.T) {
		p := gpuPod("nvidia-smi", podOpts{resource: legacyGPU, nodeSelector: onNode, command: []string{"/usr/local/nvidia/bin/nvidia-smi"}})
		p.Spec.Tolerations = []corev1.Toleration{tolerateE2E}
		p.Spec.Volumes = []corev1.Volume{
			{Name: "library-dir-host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/home/kubernetes/bin/nvidia"}}},
			{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
			{Name: "library-dir-host", MountPath: "/usr/local/nvidia", ReadOnly: true},
			{Name: "data", MountPath: "/data"},
		}
		got := createPod(t, ns, p)
		assertOnePool(t, got, fp)
		if len(got.Spec.Volumes) != 1 || got.Spec.Volumes[0].Name != "data" || len(got.Spec.Containers[0].VolumeMounts) != 1 || got.Spec.Containers[0].VolumeMounts[0].Name != "data" {
			t.Errorf("pod %s has volumes %v and mounts %v, want only its own data volume", got.Name, got.Spec.Volumes, got.Spec.Containers[0].VolumeMounts)
		}
		if q, ok := got.Spec.Containers[0].Resources.Limits[gpu]; !ok || q.Value() != 1 {
			t.Errorf("limits %v, want %s=1", got.Spec.Containers[0].Resources.Limits, gpu)
		}
		waitBoundTo(t, ns, got.Name, nodeName)
	})
}
