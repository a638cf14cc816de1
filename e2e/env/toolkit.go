package env

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

// ToolkitLibDir is where the toolkit node's CDI spec puts the stand-in's
// libraries in a container: the distribution folder that `nvidia-ctk cdi
// generate` names for a packaged driver, which the loader searches by
// default. gpu-injector's plugin mounts at /usr/local/nvidia/lib64 instead,
// so a container's log says who delivered.
const ToolkitLibDir = "/usr/lib/x86_64-linux-gnu"

// ToolkitBinDir is where the CDI spec puts nvidia-smi.
const ToolkitBinDir = "/usr/bin"

// toolkitDir holds the toolkit's config.toml, its CDI spec folder and its
// debug log.
func (e *Env) toolkitDir() string { return filepath.Join(e.Dir, "nvidia-container-toolkit") }

// ToolkitLogPath is nvidia-container-runtime's debug log: a line per
// container it created, with the CDI devices it applied.
func (e *Env) ToolkitLogPath() string {
	return filepath.Join(e.toolkitDir(), "nvidia-container-runtime.log")
}

// UseToolkitRuntime makes NVIDIA's container toolkit the kubelet node's
// runtime (on), or puts runc back (off), and restarts containerd. The
// toolkit runs in its cdi mode: a CDI spec of kind nvidia.com/gpu, written
// here for the node's stand-in driver, names each GPU by the UUID NVIDIA's
// device plugin sets in NVIDIA_VISIBLE_DEVICES and by index, and mounts the
// driver's libraries and nvidia-smi read-only, as `nvidia-ctk cdi generate`
// does for a driver on the host.
func (e *Env) UseToolkitRuntime(ctx context.Context, on bool) error {
	if !on {
		e.progress("putting runc back as the runtime of %s", e.KubeletNode().Name)
		return e.Cluster.RestartContainerd(ctx, nil)
	}
	bin, err := cluster.FindToolkitRuntime(e.Cluster.CacheDir)
	if err != nil {
		return err
	}
	dir := e.toolkitDir()
	specs := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(specs, 0o755); err != nil {
		return fmt.Errorf("failed to create the CDI spec folder: %w", err)
	}
	spec, err := e.toolkitCDISpec()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(specs, "nvidia.json"), spec, 0o644); err != nil {
		return fmt.Errorf("failed to write the CDI spec: %w", err)
	}
	conf := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(conf, []byte(toolkitConfig(e.ToolkitLogPath(), specs, e.Cluster.Binaries.Runc)), 0o644); err != nil {
		return fmt.Errorf("failed to write the toolkit's config: %w", err)
	}
	e.progress("making nvidia-container-runtime %s the runtime of %s", cluster.NvidiaContainerToolkitVersion, e.KubeletNode().Name)
	return e.Cluster.RestartContainerd(ctx, &cluster.ToolkitRuntime{Binary: bin, Config: conf})
}

// toolkitConfig is nvidia-container-runtime's config.toml: cdi mode, whose
// default kind turns NVIDIA_VISIBLE_DEVICES=<uuid> into nvidia.com/gpu=<uuid>
// (accepted from unprivileged containers: the toolkit's default), and the
// runc it wraps.
func toolkitConfig(log, specDir, runc string) string {
	return fmt.Sprintf(`[nvidia-container-runtime]
debug = %[1]q
log-level = "trace"
mode = "cdi"
runtimes = [%[3]q]

[nvidia-container-runtime.modes.cdi]
default-kind = "nvidia.com/gpu"
spec-dirs = [%[2]q]
`, log, specDir, runc)
}

type cdiSpec struct {
	CDIVersion     string         `json:"cdiVersion"`
	Kind           string         `json:"kind"`
	Devices        []cdiDevice    `json:"devices"`
	ContainerEdits cdiContainerEd `json:"containerEdits"`
}

type cdiDevice struct {
	Name           string         `json:"name"`
	ContainerEdits cdiContainerEd `json:"containerEdits"`
}

type cdiContainerEd struct {
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
	Mounts      []cdiMount      `json:"mounts,omitempty"`
}

type cdiDeviceNode struct {
	Path string `json:"path"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

// toolkitCDISpec is the CDI spec of the kubelet node's stand-in: its GPUs
// (the UUIDs the stand-in's NVML reports) and the driver's files, each
// library at its SONAME so that no ldconfig hook is needed.
func (e *Env) toolkitCDISpec() ([]byte, error) {
	kn := e.KubeletNode()
	files, err := standin.Files(kn.Layout, kn.DriverVersion)
	if err != nil {
		return nil, err
	}
	ro := []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	common := cdiContainerEd{DeviceNodes: []cdiDeviceNode{{"/dev/nvidiactl"}, {"/dev/nvidia-uvm"}, {"/dev/nvidia-uvm-tools"}}}
	seen := map[string]bool{}
	for _, f := range files {
		var target string
		switch f.Kind {
		case standin.KindLibrary:
			target = path.Join(ToolkitLibDir, f.Component+".so.1")
		case standin.KindBinary:
			target = path.Join(ToolkitBinDir, f.Component)
		}
		if target == "" || seen[target] {
			continue
		}
		seen[target] = true
		common.Mounts = append(common.Mounts, cdiMount{HostPath: path.Join(kn.HostRoot, f.Path), ContainerPath: target, Options: ro})
	}
	spec := cdiSpec{CDIVersion: "0.6.0", Kind: "nvidia.com/gpu", ContainerEdits: common}
	all := cdiDevice{Name: "all"}
	for i := range kn.GPUs {
		dev := cdiDeviceNode{fmt.Sprintf("/dev/nvidia%d", i)}
		edits := cdiContainerEd{DeviceNodes: []cdiDeviceNode{dev}}
		spec.Devices = append(spec.Devices,
			cdiDevice{Name: standin.UUID(i), ContainerEdits: edits},
			cdiDevice{Name: strconv.Itoa(i), ContainerEdits: edits})
		all.ContainerEdits.DeviceNodes = append(all.ContainerEdits.DeviceNodes, dev)
	}
	spec.Devices = append(spec.Devices, all)
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("failed to encode the CDI spec: %w", err)
	}
	return b, nil
}

// RemoveKubeletNode deletes the kubelet node's Node and its pods, as a pool
// scaling to zero removes its last node; the kubelet keeps running, its
// containers too, until RejoinKubeletNode. The pods go at once, as the pod
// garbage collector would delete them within a minute: otherwise it deletes
// the new node's pods after it joins.
func (e *Env) RemoveKubeletNode(ctx context.Context) error {
	name := e.KubeletNode().Name
	e.progress("removing node %s", name)
	if err := e.Clientset.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("failed to delete node %s: %w", name, err)
	}
	zero := int64(0)
	nss, err := e.Clientset.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("failed to list namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if err := e.Clientset.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
			metav1.ListOptions{FieldSelector: "spec.nodeName=" + name}); err != nil {
			return fmt.Errorf("failed to delete the pods of node %s in %s: %w", name, ns.Name, err)
		}
	}
	return nil
}

// RejoinKubeletNode restarts the kubelet, which registers its Node anew with
// only the labels of its --node-labels (what an autoscaler's node template
// gives a new node), and lifts the not-ready taint, as the node lifecycle
// controller, off in this cluster, would.
func (e *Env) RejoinKubeletNode(ctx context.Context) error {
	name := e.KubeletNode().Name
	e.progress("node %s joins", name)
	if err := e.Cluster.RestartKubelet(ctx); err != nil {
		return err
	}
	return untaintNotReady(ctx, e.Clientset, name)
}
