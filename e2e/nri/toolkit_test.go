//go:build e2e

package nri

import (
	"context"
	"encoding/json"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/layout"
)

// TestScaleFromZeroToolkit: with the chart's default values, the pool of
// the kubelet node is at zero (its Node deleted, and its pods); a GPU Job
// for that pool (nvidia.com/gpu, a nodeSelector on the pool's accelerator
// label) is admitted, marked for runtime injection with no hostPath and no
// pin, and Pending. A node of the pool then joins whose containerd runs
// NVIDIA's container toolkit (nvidia-container-runtime in cdi mode as its
// default runtime's binary), with only its template's labels: the probe
// publishes the toolkit's layout, and the Job completes with the stand-in
// driver that the toolkit's CDI spec mounted (nvidia-smi from /usr/bin, libcuda
// from /usr/lib/x86_64-linux-gnu, not gpu-injector's /usr/local/nvidia), the
// toolkit's log naming the CDI devices it applied. The node leaves and joins
// again with runc afterwards, as the suite had it.
func TestScaleFromZeroToolkit(t *testing.T) {
	needContainerd(t, "containerd's configuration")
	waitPluginReady(t)
	kn := testEnv.KubeletNode()
	start := time.Now()
	stopLocal, err := testEnv.StartLocalWebhook(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stopLocal(); err != nil {
			t.Errorf("failed to stop the local webhook: %v", err)
		}
	})
	fp := nodeFingerprint(t, kn.Name)
	if err := testEnv.RemoveKubeletNode(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rejoinWithRunc(t, fp) })

	ns := namespace(t, "baseline")
	job, err := client().BatchV1().Jobs(ns).Create(context.Background(), toolkitJob(kn.Accelerator), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a GPU Job for a pool at zero was refused: %v", err)
	}
	pod := waitJobPodUnschedulable(t, ns, job.Name)
	assertRuntimeInjected(t, pod, "nvidia-smi", "cuda-check")
	t.Logf("job %s admitted and pending after %s", job.Name, time.Since(start).Round(time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testEnv.UseToolkitRuntime(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := testEnv.RejoinKubeletNode(ctx); err != nil {
		t.Fatal(err)
	}
	joined := time.Now()
	plan := waitToolkitLayout(t, kn.Name)
	if plan.DriverVersion != kn.DriverVersion || len(plan.Mounts) != 0 {
		t.Errorf("node %s published %+v, want driver %s and no mounts", kn.Name, plan, kn.DriverVersion)
	}
	done := waitDone(t, ns, pod.Name)
	smi, cuda := podLog(t, ns, pod.Name, "nvidia-smi"), podLog(t, ns, pod.Name, "cuda-check")
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("job pod %s on the toolkit node:\nnvidia-smi:\n%s\ncuda-check:\n%s", done.Status.Phase, smi, cuda)
	}
	t.Logf("job done %s after the node joined (%s in all)\nnvidia-smi:\n%s\ncuda-check:\n%s", time.Since(joined).Round(time.Second), time.Since(start).Round(time.Second), smi, cuda)
	assertToolkitDelivered(t, done, smi, cuda, kn.DriverVersion)
}

// toolkitJob is a Job of two GPU containers, nvidia-smi and cuda-check, by
// PATH and with no volumes, for the pool of an accelerator.
func toolkitJob(accelerator string) *batchv1.Job {
	backoff, no := int32(0), false
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "toolkit"},
		Spec: batchv1.JobSpec{BackoffLimit: &backoff, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &no,
			NodeSelector: map[string]string{env.LabelAccelerator: accelerator},
			Containers: []corev1.Container{
				container("nvidia-smi", gpu, standin.NvidiaSMI),
				container("cuda-check", gpu, workloads.CUDACheck),
			},
		}}},
	}
}

// waitJobPodUnschedulable waits for the Job's pod to be Pending with the
// scheduler's Unschedulable, and returns it.
func waitJobPodUnschedulable(t *testing.T, ns, job string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, apiTimeout, "the pod of job "+job+" to be unschedulable", func(ctx context.Context) (bool, error) {
		pods, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil || len(pods.Items) != 1 {
			return false, nil
		}
		pod = &pods.Items[0]
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return pod.Status.Phase == corev1.PodPending, nil
			}
		}
		return false, nil
	})
	return pod
}

func nodeFingerprint(t *testing.T, name string) string {
	t.Helper()
	n, err := client().CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[layout.LabelFingerprint]
}

// waitToolkitLayout waits until the node's probe publishes a layout whose
// driver the toolkit injects, and returns it.
func waitToolkitLayout(t *testing.T, name string) layout.Plan {
	t.Helper()
	var plan layout.Plan
	poll(t, 2*time.Minute, "node "+name+" to publish the toolkit's layout", func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || n.Labels[layout.LabelState] != layout.StateReady {
			return false, nil
		}
		p, err := layout.Decode(n.Annotations[layout.AnnotationLayout])
		if err != nil {
			return false, nil
		}
		plan = p
		return p.RuntimeInjection == layout.RuntimeToolkit, nil
	})
	return plan
}

// assertToolkitDelivered checks that the driver came from the toolkit's CDI
// spec: the files where it mounts them, no hostPath in the pod, and the
// toolkit's log naming the devices of both containers.
func assertToolkitDelivered(t *testing.T, p *corev1.Pod, smi, cuda, version string) {
	t.Helper()
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("pod has hostPath volume %s (%s): the toolkit delivers the driver", v.Name, v.HostPath.Path)
		}
	}
	if !strings.Contains(smi, version) {
		t.Errorf("nvidia-smi log:\n%s\nwant driver %s", smi, version)
	}
	if want := "from " + path.Join(env.ToolkitLibDir, "libcuda.so.1") + " driver=" + version; !strings.Contains(cuda, want) {
		t.Errorf("cuda-check log:\n%s\nwant %q (the toolkit's mount, not gpu-injector's /usr/local/nvidia)", cuda, want)
	}
	log, err := os.ReadFile(testEnv.ToolkitLogPath())
	if err != nil {
		t.Fatalf("failed to read the toolkit's log: %v", err)
	}
	created, injected := toolkitRuns(string(log))
	for _, c := range p.Status.ContainerStatuses {
		_, id, _ := strings.Cut(c.ContainerID, "://")
		if !created[id] {
			t.Errorf("container %s (%s): the toolkit created no such container; log:\n%s", c.Name, id, lastLines(string(log), 40))
		}
	}
	var gpus []string
	for devs := range injected {
		if strings.HasPrefix(devs, "[nvidia.com/gpu=GPU-") {
			gpus = append(gpus, devs)
		}
	}
	t.Logf("the toolkit injected %v", gpus)
	if len(gpus) < 2 {
		t.Errorf("the toolkit injected CDI devices %v, want one GPU for each of the two containers; log:\n%s", gpus, lastLines(string(log), 40))
	}
}

// toolkitRuns reads nvidia-container-runtime's log: the containers it was
// asked to create, and the CDI device lists it injected. Runs of the runtime
// at the same moment write to one file, so a device list is not paired with
// its create by the order of lines. containerd asks for JSON (--log-format
// json), which the toolkit's own log follows.
func toolkitRuns(log string) (created, injected map[string]bool) {
	created, injected = map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(log, "\n") {
		var entry struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		if args, ok := strings.CutPrefix(entry.Msg, "Command line arguments: ["); ok {
			if f := strings.Fields(strings.TrimSuffix(args, "]")); slices.Contains(f, "create") {
				created[f[len(f)-1]] = true
			}
		}
		if devs, ok := strings.CutPrefix(entry.Msg, "Injecting devices using CDI: "); ok {
			injected[devs] = true
		}
	}
	return created, injected
}

// rejoinWithRunc puts the suite's node back: it leaves, containerd runs
// runc again, it joins, and its probe publishes the layout it had.
func rejoinWithRunc(t *testing.T, fp string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	kn := testEnv.KubeletNode()
	if err := testEnv.RemoveKubeletNode(ctx); err != nil {
		t.Error(err)
	}
	if err := testEnv.UseToolkitRuntime(ctx, false); err != nil {
		t.Errorf("failed to put runc back: %v", err)
		return
	}
	if err := testEnv.RejoinKubeletNode(ctx); err != nil {
		t.Errorf("failed to bring node %s back: %v", kn.Name, err)
		return
	}
	if err := testEnv.WaitWebhookReady(ctx); err != nil {
		t.Errorf("the chart's webhook did not come back on node %s: %v", kn.Name, err)
	}
	if _, err := testEnv.WaitProbePod(ctx); err != nil {
		t.Errorf("the chart's probe did not come back on node %s: %v", kn.Name, err)
	}
	got, err := testEnv.UpgradeDriver(ctx, kn.Name, kn.DriverVersion)
	if err != nil {
		t.Errorf("failed to have node %s's layout published again: %v", kn.Name, err)
	} else if got != fp {
		t.Errorf("node %s published layout %s after it came back, want %s", kn.Name, got, fp)
	}
	waitPluginReady(t)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
