package cluster

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
)

// NodeMountTable is the mount table of the node's mount namespace, as a
// path under the host's root: what the probe compares its own copy of the
// host's driver mounts with (nodeprobe --host-mount-table). On a real node
// that is init's, /proc/1/mountinfo; here the node's namespace is not init's.
func (c *Cluster) NodeMountTable() string {
	if holder := c.proc("namespace"); holder != nil {
		return fmt.Sprintf("/proc/%d/mountinfo", holder.pid())
	}
	return "/proc/1/mountinfo"
}

// InNodeNamespace runs a program in the mount namespace that containerd, its
// shims and the kubelet share, and returns its combined output. A test mounts
// there what the node's containers are to see: the host's mounts reach that
// namespace only from a mount point with shared propagation, and a machine
// whose root is private (a container, some VMs) has none.
func (c *Cluster) InNodeNamespace(ctx context.Context, bin string, args ...string) ([]byte, error) {
	holder := c.proc("namespace")
	if holder == nil {
		return nil, errors.New("failed to enter the node's mount namespace: the cluster has none")
	}
	full := append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", holder.pid()), "--", bin}, args...)
	out, err := exec.CommandContext(ctx, c.Binaries.Nsenter, full...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("failed to run %s %q in the node's mount namespace: %w: %s", bin, args, err, out)
	}
	return out, nil
}
