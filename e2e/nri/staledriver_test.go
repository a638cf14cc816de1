//go:build e2e

package nri

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/podstatus"
	"github.com/gpu-injector/gpu-injector/status"
)

// holdSource loads the driver's libcuda.so.1, as a CUDA program does, and
// keeps it mapped until the pod is deleted.
const holdSource = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (dlopen("libcuda.so.1", RTLD_NOW) == NULL) {
		printf("cannot load libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	printf("holding libcuda.so.1\n");
	for (;;) pause();
}
`

const holdRef = "gpu-injector.local/e2e/cuda-hold:v1"

// holdPod runs the holding program with one GPU on the kubelet node.
func holdPod(name string) *corev1.Pod {
	p := cudaPod(name)
	p.Spec.Containers[0].Image = holdRef
	p.Spec.Containers[0].Command = []string{"/usr/bin/cuda-hold"}
	return p
}

func waitHolding(t *testing.T, ns, name string) {
	t.Helper()
	poll(t, runTimeout, "pod "+ns+"/"+name+" to hold libcuda", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			if err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) {
				return false, errors.New("pod ended: " + podLog(t, ns, name, "cuda"))
			}
			return false, nil
		}
		return strings.Contains(podLog(t, ns, name, "cuda"), "holding libcuda.so.1"), nil
	})
}

// staleRecord reads the kubelet node's gpu-injector.io/stale-driver.
func staleRecord(ctx context.Context) (layout.StaleDriver, bool, error) {
	n, err := client().CoreV1().Nodes().Get(ctx, testEnv.KubeletNode().Name, metav1.GetOptions{})
	if err != nil {
		return layout.StaleDriver{}, false, nil
	}
	v, ok := n.Annotations[layout.AnnotationStaleDriver]
	if !ok {
		return layout.StaleDriver{}, false, nil
	}
	s, err := layout.DecodeStaleDriver(v)
	return s, true, err
}

// statusPod runs `gpu-injector status pod` as a user would, and decodes its
// JSON report.
func statusPod(t *testing.T, target string, args ...string) (*podstatus.Report, int) {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), testEnv.Binary,
		append([]string{"status", "pod", target, "--kubeconfig", testEnv.Kubeconfig, "-o", "json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("failed to run status pod: %v", err)
	}
	if code != status.ExitOK && code != status.ExitAttention {
		t.Fatalf("status pod %s: exit %d\n%s", target, code, stderr.String())
	}
	var r podstatus.Report
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("status pod %s: %v\n%s", target, err, stdout.String())
	}
	// The table, for the log and as a user sees it.
	table, _ := exec.Command(testEnv.Binary, append([]string{"status", "pod", target, "--kubeconfig", testEnv.Kubeconfig}, args...)...).Output()
	t.Logf("gpu-injector status pod %s (exit %d):\n%s", target, code, table)
	return &r, code
}

// TestStaleDriver: a pod holds the stand-in's libcuda while the node's
// driver is upgraded (its files replaced). The NRI plugin finds the pod on a
// deleted driver, the probe publishes it on the Node, and `status pod` says
// to restart it; once restarted, the pod maps the new driver and is no
// longer reported.
func TestStaleDriver(t *testing.T) {
	waitPluginReady(t)
	kn := testEnv.KubeletNode()
	files := cudaCheckFiles(t)
	files["/usr/bin/cuda-hold"] = compile(t, t.TempDir(), "cuda-hold", holdSource, "-ldl")
	importImage(t, holdRef, files, "PATH=/usr/bin:/bin")
	ns := namespace(t, "baseline")
	target := ns + "/held"

	createInjected(t, ns, holdPod("held"))
	waitHolding(t, ns, "held")
	// Other GPU containers of the node may be stale already: NVIDIA's device
	// plugin maps the driver's NVML, and the suite's driver upgrade leaves it
	// on the deleted one, as a real upgrade does. The held pod is scanned
	// (a GPU container that is not stale) and not named.
	poll(t, runTimeout, "the plugin to scan the held pod", func(ctx context.Context) (bool, error) {
		s, ok, err := staleRecord(ctx)
		return ok && s.Containers > s.StaleContainers && !slices.Contains(s.Pods, target), err
	})
	r, code := statusPod(t, target)
	if code != status.ExitOK || r.Delivery != podstatus.DeliveryNRI || !strings.HasPrefix(r.StaleDriver, "no") ||
		r.NodeLayout == nil || !r.NodeLayout.StillHas || r.Admission != nil {
		t.Errorf("a running pod on the current driver: exit %d, %+v", code, r)
	}

	old, next := kn.DriverVersion, "550.163.01"
	if _, err := testEnv.UpgradeDriver(context.Background(), kn.Name, next); err != nil {
		t.Fatalf("failed to upgrade the driver: %v", err)
	}
	t.Cleanup(func() {
		if _, err := testEnv.UpgradeDriver(context.Background(), kn.Name, old); err != nil {
			t.Errorf("failed to restore driver %s: %v", old, err)
		}
	})
	poll(t, runTimeout, "the held pod reported on a deleted driver", func(ctx context.Context) (bool, error) {
		s, ok, err := staleRecord(ctx)
		return ok && slices.Contains(s.Pods, target), err
	})
	r, code = statusPod(t, target)
	if code != status.ExitAttention || !strings.HasPrefix(r.StaleDriver, "yes") {
		t.Errorf("the stale pod: exit %d, stale driver %q; want %d, yes", code, r.StaleDriver, status.ExitAttention)
	}
	out, errOut, _ := runStatus(t)
	if !strings.Contains(out, target) || !strings.Contains(out, "restart them") {
		t.Errorf("gpu-injector status does not name the pod to restart:\n%s\n%s", out, errOut)
	}

	// Restarted: deleted, created again by its owner (here, the test).
	release(t, ns, "held")
	poll(t, runTimeout, "the held pod to go", func(ctx context.Context) (bool, error) {
		_, err := client().CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
		return err != nil, nil
	})
	createInjected(t, ns, holdPod("held"))
	waitHolding(t, ns, "held")
	poll(t, runTimeout, "the restarted pod no longer reported", func(ctx context.Context) (bool, error) {
		s, ok, err := staleRecord(ctx)
		return ok && s.Containers >= 1 && !slices.Contains(s.Pods, target), err
	})
	r, code = statusPod(t, target)
	if code != status.ExitOK || !strings.HasPrefix(r.StaleDriver, "no") {
		t.Errorf("the restarted pod: exit %d, stale driver %q", code, r.StaleDriver)
	}
	release(t, ns, "held")
}

func runStatus(t *testing.T) (string, string, int) {
	t.Helper()
	cmd := exec.Command(testEnv.Binary, "status", "--kubeconfig", testEnv.Kubeconfig, "--color", "never")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return stdout.String(), stderr.String(), exit.ExitCode()
	}
	return stdout.String(), stderr.String(), 0
}

// TestStatusPod: `gpu-injector status pod` on a Pending pod (no node fits
// it: the webhook marks it for the plugin, as it would now, and the
// scheduler says why it waits) and on a pod whose container the node's
// plugin refused (its image requires a newer CUDA than the node's driver).
func TestStatusPod(t *testing.T) {
	waitPluginReady(t)
	ns := namespace(t, "baseline")

	pending := cudaPod("pending")
	pending.Spec.NodeSelector = map[string]string{"gpu-injector.io/e2e-no-such-pool": "x"}
	createInjected(t, ns, pending)
	poll(t, runTimeout, "the scheduler to give up on pod pending", func(ctx context.Context) (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, "pending", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return true, nil
			}
		}
		return false, nil
	})
	r, code := statusPod(t, ns+"/pending")
	if code != status.ExitAttention || r.Phase != string(corev1.PodPending) || r.Scheduling == "" || r.Admission == nil ||
		r.Admission.Decision != "Injected" || !r.Admission.Runtime {
		t.Errorf("the Pending pod: exit %d, %+v, admission %+v", code, r, r.Admission)
	}

	cuda, err := standin.CUDADriverVersion(testEnv.KubeletNode().DriverVersion)
	if err != nil {
		t.Fatal(err)
	}
	const ref = "gpu-injector.local/e2e/cuda-status-too-new:v1"
	importImage(t, ref, cudaCheckFiles(t), "PATH=/usr/local/nvidia/bin:/usr/bin:/bin", fmt.Sprintf("NVIDIA_REQUIRE_CUDA=cuda>=%d.0", cuda/1000+1))
	refused := cudaPod("refused")
	refused.Spec.Containers[0].Image = ref
	createInjected(t, ns, refused)
	why := waitRefused(t, ns, "refused")
	r, code = statusPod(t, ns+"/refused")
	if code != status.ExitAttention || len(r.Containers) == 0 || !r.Containers[0].RefusedByPlugin ||
		!strings.Contains(strings.Join(r.Attention, "\n"), "refused at creation by the node's gpu-injector NRI plugin") || r.Admission == nil {
		t.Errorf("the refused pod (%s): exit %d, %+v", why, code, r)
	}
	release(t, ns, "refused")

	// A pod the API server never stored: an error that says how to ask.
	cmd := exec.Command(testEnv.Binary, "status", "pod", ns+"/never", "--kubeconfig", testEnv.Kubeconfig)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != status.ExitError || !strings.Contains(string(out), "-f") {
		t.Errorf("status pod of a missing pod: %v\n%s", err, out)
	}
}
