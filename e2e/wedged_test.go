//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

// The chart's NVML limit (nodeprobe.nvmlTimeout) and the time docs/nodeprobe.md
// gives for a probe that finds the driver hung: the limit, then one write.
// wedgeSlack covers that write, the kubelet's SIGHUP delivery through
// containerd and this 2-core machine's scheduling.
const (
	chartNVMLTimeout = 30 * time.Second
	wedgeSlack       = 30 * time.Second
)

// wedgedCondition is the node's GPUDriverWedged condition, or nil.
func wedgedCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == nodeprobe.NodeConditionDriverWedged {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// waitNodeState waits until the node's state label is want and returns the node.
func waitNodeState(t *testing.T, name, want string, timeout time.Duration) *corev1.Node {
	t.Helper()
	var node *corev1.Node
	waitFor(t, timeout, "node "+name+" in state "+want, func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return n.Labels[layout.LabelState] == want, nil
	})
	return node
}

// TestWedgedDriver: the kubelet node's stand-in NVML is made to hang (its
// fault switch, which the probe pod sees through the host root), as a wedged
// kernel module hangs every NVML call, and the probe is told to probe now.
// Within the NVML limit and a write the node is marked: state wedged, the
// reason naming the stuck call, the GPUDriverWedged condition, no layout; the
// probe is not restarted for it. A GPU pod for that node is denied with the
// node and its state; one free to go elsewhere gets another layout. A probe
// restarted while the driver still hangs keeps the mark. When the switch
// goes, the stuck call returns, the probe probes at once unasked, the mark
// clears, and a new pod for the node is injected and runs.
func TestWedgedDriver(t *testing.T) {
	kn := testEnv.KubeletNode()
	ns := newNamespace(t, true)
	onKubelet := map[string]string{env.LabelAccelerator: kn.Accelerator}
	fp := currentFingerprint(t, kn.Name)
	restarts := kn.ProbeRestarts()
	// Whatever happens here, the tests after this one need a driver that answers.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := testEnv.SetNVMLFault(kn.Name, standin.FaultHang, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if _, err := testEnv.WaitProbed(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	start := time.Now()
	if err := testEnv.SetNVMLFault(kn.Name, standin.FaultHang, true); err != nil {
		t.Fatal(err)
	}
	if err := testEnv.ProbeNow(testContext(t), kn.Name); err != nil {
		t.Fatal(err)
	}
	node := waitNodeState(t, kn.Name, layout.StateWedged, chartNVMLTimeout+wedgeSlack)
	t.Logf("node %s marked wedged %s after the SIGHUP (NVML limit %s)", kn.Name, time.Since(start).Round(time.Second), chartNVMLTimeout)
	// The probe writes the state label first and the condition in a second
	// write of Node status: the whole mark is there once the condition is.
	waitFor(t, apiTimeout, "the "+string(nodeprobe.NodeConditionDriverWedged)+" condition on node "+kn.Name, func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		return wedgedCondition(n) != nil, nil
	})
	reason := node.Annotations[layout.AnnotationStateReason]
	if want := "DriverWedged: NVML does not answer: nvmlInit has not returned within 30s (called at "; !strings.HasPrefix(reason, want) {
		t.Errorf("state-reason %q, want it to start with %q", reason, want)
	}
	if _, ok := node.Labels[layout.LabelFingerprint]; ok {
		t.Errorf("the wedged node keeps its fingerprint label: %v", node.Labels)
	}
	if _, ok := node.Annotations[layout.AnnotationLayout]; ok {
		t.Error("the wedged node keeps its layout annotation")
	}
	if c := wedgedCondition(node); c == nil || c.Status != corev1.ConditionTrue || c.Reason != string(nodeprobe.ConditionDriverWedged) {
		t.Errorf("condition %s = %+v, want True with reason %s", nodeprobe.NodeConditionDriverWedged, c, nodeprobe.ConditionDriverWedged)
	}
	if got := kn.ProbeRestarts(); got != restarts {
		t.Errorf("the probe restarted (%d -> %d) before it marked the node: the mark must not need a restart", restarts, got)
	}
	if err := testEnv.WaitWebhookMetric(testContext(t), "gpu_injector_wedged_nodes 1"); err != nil {
		t.Fatal(err)
	}

	t.Run("a GPU pod for the node is denied with the reason", func(t *testing.T) {
		manifest := `apiVersion: v1
kind: Pod
metadata:
  name: wants-the-wedged-node
spec:
  restartPolicy: Never
  nodeSelector:
    ` + env.LabelAccelerator + `: ` + kn.Accelerator + `
  containers:
  - name: cuda
    image: ` + env.WorkloadImage + `
    imagePullPolicy: Never
    resources:
      limits:
        nvidia.com/gpu: 1
`
		stdout, stderr, err := kubectl(t, manifest, "create", "-n", ns, "-f", "-")
		if err == nil {
			t.Fatalf("kubectl create succeeded, want a denial; stdout: %s", stdout)
		}
		for _, want := range []string{
			`admission webhook "pods.gpu-injector.io" denied the request`,
			fmt.Sprintf("node %s fits the pod but its NVIDIA driver is wedged (DriverWedged: NVML does not answer: nvmlInit has not returned within 30s", kn.Name),
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("kubectl stderr:\n%s\nwant %q", stderr, want)
			}
		}
		t.Logf("kubectl said: %s", strings.TrimSpace(stderr))
	})

	t.Run("a GPU pod free to go elsewhere gets another layout", func(t *testing.T) {
		p := createPod(t, ns, gpuPod("anywhere", podOpts{resource: gpu}))
		rec, ok := injected(t, p)
		if !ok || rec.Fingerprint == "" || rec.Fingerprint == fp {
			t.Errorf("pod injected with %+v (ok %v), want a layout other than the wedged node's %s", rec, ok, fp)
		}
	})

	t.Run("a restarted probe keeps the mark", func(t *testing.T) {
		// Every state the node shows while the probe restarts.
		watchCtx, stop := context.WithCancel(context.Background())
		var mu sync.Mutex
		seen := map[string]bool{}
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for watchCtx.Err() == nil {
				if n, err := client().CoreV1().Nodes().Get(watchCtx, kn.Name, metav1.GetOptions{}); err == nil {
					mu.Lock()
					seen[n.Labels[layout.LabelState]] = true
					mu.Unlock()
				}
				time.Sleep(250 * time.Millisecond)
			}
		}()
		p, err := testEnv.ProbePod(testContext(t))
		if err != nil {
			t.Fatal(err)
		}
		before := kn.ProbeRestarts()
		if err := testEnv.SignalContainer(testContext(t), p, "nodeprobe", "SIGKILL"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the probe container to restart", func(context.Context) (bool, error) {
			return kn.ProbeRestarts() > before, nil
		})
		// Ready means the new process published a finished probe: with the
		// driver still hung, that took the whole NVML limit.
		if _, err := testEnv.WaitProbePod(testContext(t)); err != nil {
			t.Fatal(err)
		}
		stop()
		<-watched
		mu.Lock()
		defer mu.Unlock()
		if len(seen) != 1 || !seen[layout.StateWedged] {
			t.Errorf("states seen while the probe restarted: %v, want only %s", seen, layout.StateWedged)
		}
	})

	recovered := time.Now()
	// No SIGHUP: the stuck call returning is what makes the probe look again.
	if err := testEnv.SetNVMLFault(kn.Name, standin.FaultHang, false); err != nil {
		t.Fatal(err)
	}
	node = waitNodeState(t, kn.Name, layout.StateReady, wedgeSlack)
	t.Logf("node %s ready again %s after the driver answered", kn.Name, time.Since(recovered).Round(time.Second))
	waitFor(t, apiTimeout, "the "+string(nodeprobe.NodeConditionDriverWedged)+" condition of node "+kn.Name+" to clear", func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		node = n
		c := wedgedCondition(n)
		return c != nil && c.Status != corev1.ConditionTrue, nil
	})
	if got := node.Labels[layout.LabelFingerprint]; got != fp {
		t.Errorf("fingerprint after recovery %q, want the one before, %s", got, fp)
	}
	if _, ok := node.Annotations[layout.AnnotationStateReason]; ok {
		t.Errorf("state-reason kept after recovery: %q", node.Annotations[layout.AnnotationStateReason])
	}
	if c := wedgedCondition(node); c == nil || c.Status != corev1.ConditionFalse || c.Reason != nodeprobe.ReasonDriverAnswers {
		t.Errorf("condition %s after recovery = %+v, want False with reason %s", nodeprobe.NodeConditionDriverWedged, c, nodeprobe.ReasonDriverAnswers)
	}
	if err := testEnv.WaitWebhookSees(testContext(t), env.Fingerprints{kn.Name: fp}); err != nil {
		t.Fatal(err)
	}
	if err := testEnv.WaitWebhookMetric(testContext(t), "gpu_injector_wedged_nodes 0"); err != nil {
		t.Fatal(err)
	}

	t.Run("after recovery a GPU pod for the node is injected and runs", func(t *testing.T) {
		p := createPod(t, ns, gpuPod("after-recovery", podOpts{resource: gpu, nodeSelector: onKubelet}))
		assertInjected(t, p, kn)
		done := waitPodDone(t, ns, p.Name)
		log := podLog(t, ns, p.Name, "cuda")
		if want := "driver=" + kn.DriverVersion; done.Status.Phase != corev1.PodSucceeded || !strings.Contains(log, want) {
			t.Fatalf("pod after recovery: phase %s, log:\n%s\nwant Succeeded with %q", done.Status.Phase, log, want)
		}
	})
}
