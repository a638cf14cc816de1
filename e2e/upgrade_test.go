//go:build e2e

package e2e

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// upgradeVersion is the stand-in the kubelet node is upgraded to.
const upgradeVersion = "550.54.15"

// TestDriverUpgrade: the kubelet node's driver is upgraded under a pod that
// already ran. The probe re-probes on SIGHUP (and restarts to load the new
// NVML library), the node publishes a new layout and fingerprint; the old pod
// is untouched (same selector, still Succeeded, its log still shows the old
// driver); a new pod is pinned to the new fingerprint and loads the new driver.
func TestDriverUpgrade(t *testing.T) {
	kn := testEnv.KubeletNode()
	if kn.DriverVersion == upgradeVersion {
		t.Fatalf("the kubelet node already runs %s; the suite upgrades once", upgradeVersion)
	}
	ns := newNamespace(t, true)
	onKubelet := map[string]string{env.LabelAccelerator: kn.Accelerator}
	oldVersion := kn.DriverVersion
	oldFP := currentFingerprint(t, kn.Name)

	before := createPod(t, ns, gpuPod("before-upgrade", podOpts{resource: gpu, nodeSelector: onKubelet}))
	assertInjected(t, before, kn)
	if done := waitPodDone(t, ns, before.Name); done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod before the upgrade: phase %s, log:\n%s", done.Status.Phase, podLog(t, ns, before.Name, "cuda"))
	}
	restarts := kn.ProbeRestarts()

	newFP, err := testEnv.UpgradeDriver(testContext(t), kn.Name, upgradeVersion)
	if err != nil {
		t.Fatalf("failed to upgrade: %v", err)
	}
	if newFP == oldFP {
		t.Fatalf("fingerprint stayed %s after the upgrade", oldFP)
	}
	t.Logf("fingerprint %s -> %s; probe restarts %d -> %d", oldFP, newFP, restarts, kn.ProbeRestarts())
	node, err := client().CoreV1().Nodes().Get(testContext(t), kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("failed to get node: %v", err)
	}
	if got := node.Labels[layout.LabelDriverVersion]; got != upgradeVersion {
		t.Errorf("node %s label %s=%q, want %s", kn.Name, layout.LabelDriverVersion, got, upgradeVersion)
	}
	if plan := node.Annotations[layout.AnnotationLayout]; strings.Contains(plan, oldVersion) || !strings.Contains(plan, upgradeVersion) {
		t.Errorf("layout after the upgrade names the old version or misses the new one: %s", plan)
	}

	t.Run("existing pod untouched", func(t *testing.T) {
		now, err := client().CoreV1().Pods(ns).Get(testContext(t), before.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("failed to get pod: %v", err)
		}
		if !reflect.DeepEqual(now.Spec.NodeSelector, before.Spec.NodeSelector) || now.Spec.NodeSelector[layout.LabelFingerprint] != oldFP {
			t.Errorf("nodeSelector %v, want the original %v", now.Spec.NodeSelector, before.Spec.NodeSelector)
		}
		if !reflect.DeepEqual(now.Spec.Volumes, before.Spec.Volumes) {
			t.Errorf("volumes changed: %v, want %v", now.Spec.Volumes, before.Spec.Volumes)
		}
		if now.Status.Phase != corev1.PodSucceeded {
			t.Errorf("phase %s, want Succeeded", now.Status.Phase)
		}
		if log := podLog(t, ns, before.Name, "cuda"); !strings.Contains(log, "driver="+oldVersion) {
			t.Errorf("log of the pod before the upgrade:\n%s\nwant driver=%s", log, oldVersion)
		}
	})

	t.Run("new pod pinned to the new layout and loads the new driver", func(t *testing.T) {
		after := createPod(t, ns, gpuPod("after-upgrade", podOpts{resource: gpu, nodeSelector: onKubelet}))
		assertInjected(t, after, kn)
		if got := after.Spec.NodeSelector[layout.LabelFingerprint]; got != newFP {
			t.Fatalf("new pod pinned to %q, want the new fingerprint %s", got, newFP)
		}
		done := waitPodDone(t, ns, after.Name)
		log := podLog(t, ns, after.Name, "cuda")
		want := fmt.Sprintf("driver=%s", upgradeVersion)
		if done.Status.Phase != corev1.PodSucceeded || !strings.Contains(log, want) {
			t.Fatalf("pod after the upgrade: phase %s, log:\n%s\nwant Succeeded with %q", done.Status.Phase, log, want)
		}
	})
}
