package env

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

// GPUResource is the extended resource the device plugin and API nodes offer.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// LabelAccelerator is the node label of the classic tutorials that pods
// select a GPU model with.
const LabelAccelerator = "accelerator"

// LabelGPUPresent is what NVIDIA's GPU feature discovery sets, and what the
// chart's probe DaemonSet selects.
const LabelGPUPresent = "nvidia.com/gpu.present"

// Node is one simulated GPU node and its stand-in driver.
type Node struct {
	Name string
	// Kubelet is true for the node a real kubelet runs; the others are API
	// objects only, whose pods are bound but never run.
	Kubelet bool
	Layout  standin.Layout
	// Accelerator is the value of the accelerator label (a GPU model).
	Accelerator string
	// DriverVersion is the stand-in installed now; UpgradeDriver changes it.
	DriverVersion string
	// GPUs is the node's allocatable nvidia.com/gpu.
	GPUs int
	// HostRoot is the node's root: / for the kubelet node (whose probe pod
	// mounts it through the chart's hostPath), a folder for the others, whose
	// local probe process gets it as --host-root.
	HostRoot string
	// ProbeLog is the local probe's log file; empty on the kubelet node,
	// whose probe logs are the pod's (Env.PodLog, and LogsDir/pods after Down).
	ProbeLog string

	// stage is a private root where the stand-in is built and installed
	// first; for the kubelet node it is mirrored onto the host.
	stage string
	probe *proc
	// restarts counts the in-cluster probe's container restarts.
	restarts func() int
	// probeKubeconfig holds a token bound to the node's probe pod.
	probeKubeconfig string
}

// ProbeKubeconfig is a kubeconfig with the probe service account's token
// bound to a pod on this node: what the probe runs with.
func (n *Node) ProbeKubeconfig() string { return n.probeKubeconfig }

// ProbeRestarts counts the times the node's probe exited and was started
// again (it exits to load a new NVML library after an upgrade).
func (n *Node) ProbeRestarts() int {
	if n.restarts != nil {
		return n.restarts()
	}
	return n.probe.Restarts()
}

// The default nodes: the three classic layouts of the old tutorials.
func defaultNodes() []*Node {
	return []*Node{
		// NVIDIA's device plugin advertises what the stand-in's NVML reports;
		// the API-only nodes offer fewer, so the MostGPUs policy prefers the
		// node whose pods run.
		{Name: "gke-t4", Kubelet: true, Layout: standin.GKE, Accelerator: "nvidia-tesla-t4", DriverVersion: "535.104.05", GPUs: standin.DeviceCount, HostRoot: "/"},
		{Name: "ubuntu-k80", Layout: standin.UbuntuNvidia, Accelerator: "nvidia-tesla-k80", DriverVersion: "384.130", GPUs: 1},
		{Name: "centos-p100", Layout: standin.CentOS7, Accelerator: "nvidia-tesla-p100", DriverVersion: "418.87.01", GPUs: 1},
	}
}

// hostDriverDir is where the kubelet node's stand-in lives on this machine:
// the GKE layout, under the default allowlist and absent from dev machines.
const hostDriverDir = "/home/kubernetes/bin/nvidia"

// hostMarker in hostDriverDir says the folder is ours to replace and remove.
const hostMarker = ".gpu-injector-e2e"

// hostLockPath serializes environments on one machine: they share hostDriverDir.
const hostLockPath = "/run/lock/gpu-injector-e2e-host-driver.lock"

// lockHost takes the machine-wide lock on hostDriverDir, waiting up to
// patience for another environment to release it. The kernel drops it when
// the holder dies, so a crashed run never blocks.
func lockHost(ctx context.Context, patience time.Duration, progress func(string, ...any)) (*os.File, error) {
	deadline := time.Now().Add(patience)
	for said := false; ; said = true {
		f, err := tryLockHost()
		if err == nil || time.Now().After(deadline) {
			return f, err
		}
		if !said {
			progress("  waiting up to %s: %v", patience, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%v)", err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func tryLockHost() (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(hostLockPath), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", filepath.Dir(hostLockPath), err)
	}
	f, err := os.OpenFile(hostLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", hostLockPath, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(hostLockPath)
		f.Close()
		return nil, fmt.Errorf("failed to lock %s: another gpu-injector environment (%s) uses %s on this machine; stop it first (make demo, or an e2e run): %w",
			hostLockPath, strings.TrimSpace(string(owner)), hostDriverDir, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// claimHostDriverDir refuses a driver folder that is not ours: a real GKE
// node's driver must never be overwritten. A leftover of a crashed run (it
// carries our marker) is taken over.
func claimHostDriverDir() error {
	_, err := os.Lstat(hostDriverDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to inspect %s: %w", hostDriverDir, err)
	}
	if _, err := os.Stat(filepath.Join(hostDriverDir, hostMarker)); err != nil {
		return fmt.Errorf("refusing to install the stand-in driver: %s exists and is not ours (no %s marker); is this a GKE node with a real driver?", hostDriverDir, hostMarker)
	}
	return nil
}

// installDriver installs the node's stand-in driver of version into its
// stage root, and, for the kubelet node, mirrors the driver folder onto the
// host. Every file is replaced by rename, so a reader never sees half a file.
func (e *Env) installDriver(n *Node, version string) error {
	old := n.DriverVersion
	if err := e.standins.Install(n.stage, n.Layout, version); err != nil {
		return err
	}
	if old != "" && old != version {
		if err := standin.RemoveReplaced(n.stage, n.Layout, old, version); err != nil {
			return err
		}
	}
	n.DriverVersion = version
	if !n.Kubelet {
		return nil
	}
	if err := mirror(filepath.Join(n.stage, hostDriverDir), hostDriverDir); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(hostDriverDir, hostMarker), []byte("gpu-injector e2e stand-in driver ("+standin.Notice+"); removed by its environment's Down\n"), 0o644)
}

// removeHostDriver deletes the host's stand-in and the parents it left empty.
func removeHostDriver() error {
	if _, err := os.Stat(filepath.Join(hostDriverDir, hostMarker)); err != nil {
		return nil
	}
	if err := os.RemoveAll(hostDriverDir); err != nil {
		return fmt.Errorf("failed to remove %s: %w", hostDriverDir, err)
	}
	// Non-empty parents are someone else's and stay.
	for d := filepath.Dir(hostDriverDir); d != "/home"; d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break
		}
	}
	return nil
}

// mirror makes dst a copy of src: folders created, files and links replaced
// by rename, entries src lacks removed.
func mirror(src, dst string) error {
	want := map[string]bool{}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		want[rel] = true
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			tmp := target + ".e2e-tmp"
			_ = os.Remove(tmp)
			if err := os.Symlink(link, tmp); err != nil {
				return err
			}
			return os.Rename(tmp, target)
		default:
			info, err := d.Info()
			if err != nil {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tmp := target + ".e2e-tmp"
			if err := os.WriteFile(tmp, data, info.Mode().Perm()); err != nil {
				return err
			}
			if err := os.Chmod(tmp, info.Mode().Perm()); err != nil {
				return err
			}
			return os.Rename(tmp, target)
		}
	})
	if err != nil {
		return fmt.Errorf("failed to copy %s to %s: %w", src, dst, err)
	}
	var stale []string
	err = filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		if !want[rel] && rel != hostMarker {
			stale = append(stale, p)
			if d.IsDir() {
				return filepath.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("failed to list %s: %w", dst, err)
	}
	for _, p := range stale {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("failed to remove %s: %w", p, err)
		}
	}
	return nil
}

// createAPINode registers a Node no kubelet runs: Ready, with allocatable GPUs
// set through the status subresource, as a kubelet would report them.
func createAPINode(ctx context.Context, cs kubernetes.Interface, n *Node) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name,
			Labels: map[string]string{
				"kubernetes.io/hostname": n.Name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				LabelAccelerator:         n.Accelerator,
				// No nvidia.com/gpu.present: the chart's probe DaemonSet selects
				// it, and no kubelet would run its pod here; this node's probe
				// runs as a local process instead.
			},
			Annotations: map[string]string{
				"gpu-injector.io/e2e": "API object only: no kubelet runs this node; its pods are bound, never started",
			},
		},
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("failed to create node %s: %w", n.Name, err)
	}
	res := corev1.ResourceList{
		// No kubelet runs this node, so it offers no room to a pod that must
		// run: a pod asking for any CPU or memory (the chart's webhook) does
		// not fit here and goes to the kubelet node; a GPU pod that asks for
		// none is bound here, which is all an API-only node is for.
		corev1.ResourceCPU:    resource.MustParse("0"),
		corev1.ResourceMemory: resource.MustParse("0"),
		corev1.ResourcePods:   resource.MustParse("110"),
		GPUResource:           *resource.NewQuantity(int64(n.GPUs), resource.DecimalSI),
	}
	now := metav1.NewTime(time.Now())
	status := corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "StandIn",
			Message:           "simulated by the gpu-injector e2e environment",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "none (API object)"},
	}
	// The controller-manager's ttl controller annotates new nodes at once.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = status
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to set status of node %s: %w", n.Name, err)
	}
	return untaintNotReady(ctx, cs, n.Name)
}

// untaintNotReady removes the node.kubernetes.io/not-ready taint from a
// Ready node, as the node lifecycle controller would: the API server's
// TaintNodesByCondition admission puts it on every new Node.
func untaintNotReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = keep
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("failed to remove the not-ready taint of node %s: %w", name, err)
	}
	return nil
}
