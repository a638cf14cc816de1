package env

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// hostDriverDir is where the kubelet node's stand-in lives as the node sees
// it: the GKE layout, under the default allowlist.
const hostDriverDir = "/home/kubernetes/bin/nvidia"

// kubeletHome is bound, in the node's mount namespace, to the environment's
// own folder (the kubelet node's stage): the kubelet, the runtime, the probe
// and every hostPath volume see this environment's driver there, while
// another environment on the machine sees its own and a real GKE node's
// driver is never touched. It is hostDriverDir's parent, not the folder
// itself, so that a test can remove the driver and install it again.
const kubeletHome = "/home/kubernetes"

// DriverRoot is where this process finds the node's stand-in driver: the
// API-only node's host root, and for the kubelet node the folder its mount
// namespace binds at kubeletHome, under that same path.
func (n *Node) DriverRoot() string { return n.stage }

// What environments on one machine share and cannot have apart: the device
// nodes NVIDIA's device plugin hands GPU containers (there is one /dev), and
// the mountpoint of kubeletHome where the host lacks one. The first
// environment makes what is missing and records it in hostMadeFile; the last
// one to stop removes what was recorded. Each running environment holds a
// shared lock on hostUsersLock; joining and leaving take hostSetupLock.
// Variables for the unit test.
var (
	hostSetupLock = "/run/lock/gpu-injector-e2e-host.lock"
	hostUsersLock = "/run/lock/gpu-injector-e2e-host-users.lock"
	hostMadeFile  = "/run/lock/gpu-injector-e2e-host.made"
)

// hostSetupWait bounds the wait for another environment's join or leave,
// each a few file operations.
const hostSetupWait = time.Minute

// hostShare is an environment's part in what the machine's environments share.
type hostShare struct{ users *os.File }

// joinHost makes, under the setup lock, what prepare reports it made part of the
// machine's shared state, and keeps a shared lock until leave.
func joinHost(ctx context.Context, prepare func() ([]string, error)) (*hostShare, error) {
	setup, err := lockFile(ctx, hostSetupLock, syscall.LOCK_EX, hostSetupWait)
	if err != nil {
		return nil, err
	}
	defer setup.Close()
	users, err := lockFile(ctx, hostUsersLock, syscall.LOCK_SH, hostSetupWait)
	if err != nil {
		return nil, err
	}
	made, err := prepare()
	if rerr := recordMade(made); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return &hostShare{users: users}, err
}

// leave gives the environment's part back; the last environment removes
// what the machine's environments made.
func (h *hostShare) leave() error {
	if h == nil {
		return nil
	}
	defer h.users.Close()
	setup, err := lockFile(context.Background(), hostSetupLock, syscall.LOCK_EX, hostSetupWait)
	if err != nil {
		return err
	}
	defer setup.Close()
	// Held shared by another environment: it still uses what was made. No one
	// joins meanwhile, since joining takes the setup lock.
	if syscall.Flock(int(h.users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return nil
	}
	data, err := os.ReadFile(hostMadeFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", hostMadeFile, err)
	}
	var errs []error
	made := strings.Fields(string(data))
	// Newest first: a folder after what was made in it.
	for i := len(made) - 1; i >= 0; i-- {
		if err := os.Remove(made[i]); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", made[i], err))
		}
	}
	if err := os.Remove(hostMadeFile); err != nil {
		errs = append(errs, fmt.Errorf("failed to remove %s: %w", hostMadeFile, err))
	}
	return errors.Join(errs...)
}

func recordMade(paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	f, err := os.OpenFile(hostMadeFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", hostMadeFile, err)
	}
	_, err = f.WriteString(strings.Join(paths, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("failed to record %v in %s: %w", paths, hostMadeFile, err)
	}
	return nil
}

// lockFile opens path and takes a flock of how on it, waiting up to patience
// for its holder. The kernel drops the lock when its holder dies, so a
// crashed run never blocks.
func lockFile(ctx context.Context, path string, how int, patience time.Duration) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", path, err)
	}
	deadline := time.Now().Add(patience)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("failed to lock %s within %s: another gpu-injector environment of this machine holds it: %w", path, patience, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("failed to lock %s: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// makeMountpoint creates dir and the parents it lacks, and returns those it
// created, outermost first.
func makeMountpoint(dir string) ([]string, error) {
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("failed to inspect %s: %w", d, err)
		}
		missing = append([]string{d}, missing...)
	}
	var made []string
	for _, d := range missing {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return made, fmt.Errorf("failed to create %s: %w", d, err)
		}
		made = append(made, d)
	}
	return made, nil
}

// installDriver installs the node's stand-in driver of version into its
// stage root, which for the kubelet node is what its mount namespace sees.
// Every file is replaced by rename, so a reader never sees half a file.
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
