//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
)

// lateDriverLimit is how soon a driver installed while the probe runs must
// serve GPU pods: the probe's watch, not its 5-minute interval.
const lateDriverLimit = 15 * time.Second

// TestDriverArrivesLater: the kubelet node's stand-in driver is removed and
// the probe, told nothing, takes the node out of ready; then the driver is
// installed again while the probe pod runs, as a driver installer does after
// the node joined, again with no signal. Within 15 s the node publishes its
// layout and the webhook serves it, and a GPU pod is injected with it.
func TestDriverArrivesLater(t *testing.T) {
	kn := testEnv.KubeletNode()
	version := kn.DriverVersion
	fp := currentFingerprint(t, kn.Name)
	probe, err := testEnv.ProbePod(testContext(t))
	if err != nil {
		t.Fatalf("failed to find the probe pod: %v", err)
	}
	restarts := kn.ProbeRestarts()

	if err := testEnv.RemoveDriver(kn.Name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if kn.DriverVersion == "" {
			if err := testEnv.InstallDriver(kn.Name, version); err != nil {
				t.Errorf("failed to put the driver back: %v", err)
			}
		}
		if _, err := testEnv.WaitProbed(context.Background()); err != nil {
			t.Errorf("nodes not ready again after the test: %v", err)
		}
	})
	// The removal is seen by the same watch: no signal, well inside the interval.
	var gone *corev1.Node
	waitFor(t, lateDriverLimit, "node "+kn.Name+" to leave state ready", func(ctx context.Context) (bool, error) {
		n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		gone = n
		return n.Labels[layout.LabelState] != layout.StateReady, nil
	})
	t.Logf("driver removed: state %s, reason %q", gone.Labels[layout.LabelState], gone.Annotations[layout.AnnotationStateReason])

	if err := testEnv.InstallDriver(kn.Name, version); err != nil {
		t.Fatal(err)
	}
	installed := time.Now()
	ctx, cancel := context.WithTimeout(testContext(t), lateDriverLimit)
	defer cancel()
	fps, err := testEnv.WaitProbed(ctx)
	if err != nil {
		t.Fatalf("the node did not publish its layout within %s of the driver's install: %v", lateDriverLimit, err)
	}
	if err := testEnv.WaitWebhookSees(ctx, env.Fingerprints{kn.Name: fps[kn.Name]}); err != nil {
		t.Fatalf("the webhook did not serve the layout within %s of the driver's install: %v", lateDriverLimit, err)
	}
	t.Logf("driver installed: node ready and its layout served %s later", time.Since(installed).Round(100*time.Millisecond))
	if fps[kn.Name] != fp {
		t.Errorf("fingerprint %s after the driver came back, want %s (the same driver)", fps[kn.Name], fp)
	}
	now, err := testEnv.ProbePod(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != probe.UID || kn.ProbeRestarts() != restarts {
		t.Errorf("the probe pod was replaced or restarted (%s -> %s, restarts %d -> %d): the watch should need neither", probe.UID, now.UID, restarts, kn.ProbeRestarts())
	}

	ns := newNamespace(t, true)
	p := createPod(t, ns, gpuPod("after-late-driver", podOpts{resource: gpu, nodeSelector: map[string]string{env.LabelAccelerator: kn.Accelerator}}))
	assertInjected(t, p, kn)
	if got, err := client().CoreV1().Nodes().Get(testContext(t), kn.Name, metav1.GetOptions{}); err == nil && got.Labels[layout.LabelFingerprint] != p.Spec.NodeSelector[layout.LabelFingerprint] {
		t.Errorf("pod pinned to %s, node publishes %s", p.Spec.NodeSelector[layout.LabelFingerprint], got.Labels[layout.LabelFingerprint])
	}
}

// driverMountLimit is how soon the probe's container sees a driver mounted
// on the host after it started, where its copy of the host's mounts does not
// follow the host's: the probe's 10 s comparison, then the kubelet's restart.
const driverMountLimit = 60 * time.Second

// TestDriverMountArrivesLater: the chart's defaults on a node whose root is a
// private mount, as this machine's is when it is itself a container, and as a
// node that boots without systemd has it. The probe started there (the
// suite's install would have failed otherwise); a mount then arrives at
// /run/nvidia/driver in the node's mount namespace, as the GPU operator's
// driver container mounts its root, which the probe's container cannot see
// without propagation. The probe restarts its container once to see it, says
// so on the Node (driver-mounts=restart), and restarts once more when the
// mount goes, so it never serves from a stale copy.
func TestDriverMountArrivesLater(t *testing.T) {
	kn := testEnv.KubeletNode()
	ctx := testContext(t)
	n, err := client().CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Labels[layout.LabelDriverMounts]; got != layout.DriverMountsRestart {
		t.Errorf("label %s = %q on a node whose / is private, want %q", layout.LabelDriverMounts, got, layout.DriverMountsRestart)
	}
	restarts := kn.ProbeRestarts()
	const mount = "mkdir -p /run/nvidia/driver && mount -t tmpfs -o size=1m,mode=0755 gpu-injector-e2e /run/nvidia/driver"
	if _, err := testEnv.Cluster.InNodeNamespace(ctx, "/bin/sh", "-c", mount); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_, _ = testEnv.Cluster.InNodeNamespace(context.Background(), "/bin/sh", "-c", "umount /run/nvidia/driver")
		}
		_, _ = testEnv.Cluster.InNodeNamespace(context.Background(), "/bin/sh", "-c", "rmdir /run/nvidia/driver /run/nvidia")
		if _, err := testEnv.WaitProbed(context.Background()); err != nil {
			t.Errorf("nodes not ready again after the test: %v", err)
		}
	})
	start := time.Now()
	waitFor(t, driverMountLimit, "the probe to restart for the new driver mount", func(context.Context) (bool, error) {
		return kn.ProbeRestarts() > restarts, nil
	})
	t.Logf("driver mount seen: the probe restarted %s later", time.Since(start).Round(100*time.Millisecond))
	if _, err := testEnv.WaitProbed(ctx); err != nil {
		t.Fatalf("the node is not ready after the probe's restart: %v", err)
	}
	// Its new copy has the mount: no further restart.
	after := kn.ProbeRestarts()
	time.Sleep(25 * time.Second)
	if got := kn.ProbeRestarts(); got != after {
		t.Fatalf("the probe restarted %d more times with the mount in its copy: a loop", got-after)
	}

	if _, err := testEnv.Cluster.InNodeNamespace(ctx, "/bin/sh", "-c", "umount /run/nvidia/driver"); err != nil {
		t.Fatal(err)
	}
	mounted = false
	waitFor(t, driverMountLimit, "the probe to restart once the driver mount went", func(context.Context) (bool, error) {
		return kn.ProbeRestarts() > after, nil
	})
	// The kubelet's back-off may hold the restarted probe a while; the next test
	// reads the probe DaemonSet as ready.
	if err := testEnv.WaitProbeDaemonSet(testContext(t)); err != nil {
		t.Fatal(err)
	}
}
