package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// NodeContainerdConfig is where a node's containerd reads its configuration,
// and where gpu-injector's probe looks for the runtime that containers run
// with. The cluster's containerd reads its own file elsewhere; while the
// toolkit is its runtime, that file is bound here in the node's mount
// namespace, so that the probe reads what containerd runs with.
const NodeContainerdConfig = "/etc/containerd/config.toml"

// ToolkitRuntime is NVIDIA's container toolkit as the node's runtime:
// nvidia-container-runtime as the BinaryName of containerd's default runtime,
// as `nvidia-ctk runtime configure` leaves a node (EKS's GPU AMIs). It runs
// runc after applying, to each container that asks for GPUs, the edits of
// their CDI devices.
type ToolkitRuntime struct {
	// Binary is nvidia-container-runtime (FindToolkitRuntime).
	Binary string
	// Config is its config.toml. containerd's environment names it
	// (NVIDIA_CTK_CONFIG_FILE_PATH), which the shims and so the runtime
	// inherit.
	Config string
}

// FindToolkitRuntime returns the nvidia-container-runtime that hack/tools.sh
// built (NvidiaContainerToolkitVersion).
func FindToolkitRuntime(cacheDir string) (string, error) {
	p := filepath.Join(cacheDir, "nvidia-container-runtime-"+NvidiaContainerToolkitVersion, "nvidia-container-runtime")
	if !executable(p) {
		return "", fmt.Errorf("%s is missing: run hack/tools.sh nvidia-container-toolkit first", p)
	}
	return p, nil
}

// RestartContainerd stops the node's containerd (SIGTERM; containers keep
// running under their shims) and starts it again: with tk, nvidia-container-
// runtime is its default runtime's binary and its configuration is bound at
// NodeContainerdConfig; with nil, runc, as the cluster started. Only the NRI
// runtime's containerd (RuntimeNRI) can be restarted so.
func (c *Cluster) RestartContainerd(ctx context.Context, tk *ToolkitRuntime) error {
	if c.Runtime != RuntimeNRI {
		return fmt.Errorf("failed to restart containerd: the node runs %s, not %s", c.Runtime, RuntimeNRI)
	}
	p := c.proc("containerd")
	holder := c.proc("namespace")
	if p == nil || holder == nil {
		return errors.New("failed to restart containerd: not running")
	}
	p.stop(30 * time.Second)
	if gone, _ := p.exited(); !gone {
		return fmt.Errorf("failed to stop containerd (pid %d)", p.pid())
	}
	// A bind of an earlier toolkit start goes first: the file is bound anew
	// or not at all.
	if c.configBound {
		if _, err := c.InNodeNamespace(ctx, "umount", NodeContainerdConfig); err != nil {
			return err
		}
		c.configBound = false
	}
	dir := filepath.Join(c.Dir, "containerd")
	conf := filepath.Join(dir, "config.toml")
	b, env := c.Binaries, []string{"PATH=" + filepath.Dir(c.Binaries.ContainerdShim) + ":" + filepath.Dir(c.Binaries.Runc) + ":" + os.Getenv("PATH")}
	if tk != nil {
		conf = filepath.Join(dir, "toolkit-config.toml")
		b.Runc = tk.Binary
		env = append(env, "NVIDIA_CTK_CONFIG_FILE_PATH="+tk.Config)
	}
	cfg := containerdNRIConfig(dir, c.ContainerdSocket, fmt.Sprintf("127.0.0.1:%d", c.ports["containerdMetrics"]), filepath.Join(c.Dir, "cni", "net.d"), b)
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("failed to write containerd config: %w", err)
	}
	if tk != nil {
		if _, err := os.Stat(NodeContainerdConfig); err != nil {
			return fmt.Errorf("failed to bind containerd's config at %s, which must exist on this host (hack/install-runtime.sh installs it): %w", NodeContainerdConfig, err)
		}
		if _, err := c.InNodeNamespace(ctx, "mount", "--bind", conf, NodeContainerdConfig); err != nil {
			return err
		}
		c.configBound = true
		conf = NodeContainerdConfig
	}
	args := []string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", holder.pid()), "--", c.Binaries.Containerd, "--config", conf, "--log-level", "info"}
	containerd, err := c.startWithEnv("containerd", c.Binaries.Nsenter, args, env)
	if err != nil {
		return err
	}
	if err := c.poll(ctx, "containerd after its restart", []string{"containerd"}, func(ctx context.Context) (bool, error) {
		return exec.CommandContext(ctx, c.Binaries.Ctr, "--address", c.ContainerdSocket, "version").Run() == nil, nil
	}); err != nil {
		return withLog(err, containerd)
	}
	return nil
}
