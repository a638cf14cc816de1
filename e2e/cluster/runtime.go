package cluster

import (
	"fmt"
	"path/filepath"
)

// Runtime is the node's container runtime.
type Runtime string

const (
	// RuntimeDebian is Debian's containerd 1.6 and runc 1.1
	// (hack/install-runtime.sh), the default. It has no NRI, so the project's
	// hostPath injection is what runs on it.
	RuntimeDebian Runtime = "debian"
	// RuntimeNRI is containerd 2.x and runc built from their Go modules
	// (hack/tools.sh containerd runc), with NRI on and NRI's default validator
	// enforcing the required-plugins pod annotation: what runtime injection
	// through an NRI plugin needs. Debian bookworm's containerd 1.6 has no NRI;
	// containerd turned it on by default in 2.0.
	RuntimeNRI Runtime = "nri"
	// RuntimeCRIO is CRI-O built from its Go module (hack/tools.sh crio), with
	// Debian's conmon and hack/tools.sh's runc, NRI on as CRI-O ships it, and
	// NRI's default validator turned on (CRI-O ships it off). Debian bookworm
	// packages no CRI-O.
	RuntimeCRIO Runtime = "crio"
)

// HasNRI reports whether the runtime serves NRI plugins (Cluster.NRISocket).
func (r Runtime) HasNRI() bool { return r == RuntimeNRI || r == RuntimeCRIO }

// RuntimeProcess is the name of the runtime's process among the cluster's
// components, and so of its log (Cluster.LogPath).
func RuntimeProcess(r Runtime) string {
	if r == RuntimeCRIO {
		return "crio"
	}
	return "containerd"
}

// nriSocketInNamespace is where the NRI runtime's containerd (and CRI-O) listens for NRI
// plugins: NRI's default path, which a plugin's pod mounts as a hostPath. In
// the cluster's mount namespace it is a bind mount of the cluster's own
// folder (Cluster.NRISocket outside it), as kubeletDevicePluginDir is, so two
// clusters on one machine never share an NRI socket.
const (
	nriDirInNamespace    = "/var/run/nri"
	nriSocketInNamespace = nriDirInNamespace + "/nri.sock"
)

func (r Runtime) valid() error {
	switch r {
	case RuntimeDebian, RuntimeNRI, RuntimeCRIO:
		return nil
	}
	return fmt.Errorf("unknown runtime %q (want %q, %q or %q)", r, RuntimeDebian, RuntimeNRI, RuntimeCRIO)
}

// findNRIRuntime sets the NRI runtime's programs: the containerd, its runc
// shim, ctr and runc that hack/tools.sh built (ContainerdVersion,
// RuncVersion), with an error per missing one that says how to build it.
func findNRIRuntime(cacheDir string, b *Binaries) []error {
	ctrd := filepath.Join(cacheDir, "containerd-"+ContainerdVersion)
	b.Containerd = filepath.Join(ctrd, "containerd")
	b.ContainerdShim = filepath.Join(ctrd, "containerd-shim-runc-v2")
	b.Ctr = filepath.Join(ctrd, "ctr")
	b.Runc = filepath.Join(cacheDir, "runc-"+RuncVersion, "runc")
	var errs []error
	for _, p := range []string{b.Containerd, b.ContainerdShim, b.Ctr} {
		if !executable(p) {
			errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh containerd first", p))
		}
	}
	if !executable(b.Runc) {
		errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh runc first", b.Runc))
	}
	return errs
}

// containerdNRIConfig is the NRI runtime's config (containerd 2.x): the
// behaviour of containerdConfig's 1.6 config, in the plugins 2.x split the CRI
// plugin into, plus NRI. Everything under dir, so two clusters and the host's
// own containerd never share state. Config version 3 is 2.x's own, read by
// every 2.x release (2.4 migrates it to its version 4 at start and says so in
// its log), so CONTAINERD_VERSION may name any 2.x.
func containerdNRIConfig(dir, socket, metrics, cniConfDir string, b Binaries) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

# containerd's own metrics (the CRI's create and start timers, NRI's plugin
# latency): what a plugin costs a container's start, read by the tests.
[metrics]
  address = %[13]q

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = %[5]q

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    # The launcher builds and imports this image; nothing can be pulled.
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[6]q

    # Registry hosts (hosts.toml per host), as for a private registry: the
    # cluster's own when Options.Registry is set.
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = %[14]q

  [plugins.'io.containerd.cri.v1.runtime']
    # This machine refuses to lower oom_score_adj; without this every sandbox
    # fails with runc's "can't get final child's PID from pipe: EOF".
    restrict_oom_score_adj = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        # The shim built with this containerd, not whichever is on PATH
        # (Debian's 1.6 one may be).
        runtime_path = %[7]q

        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = %[8]q
          BinaryName = %[9]q

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[10]q]
      conf_dir = %[11]q

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  # NRI: plugins connect to the socket (bound to the cluster's own folder in
  # its mount namespace). The default validator refuses a container whose pod
  # names, in required-plugins.noderesource.dev/container.<name>, a plugin
  # that is not connected: runtime injection relies on it.
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = %[12]q

    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
`,
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, socket+".ttrpc",
		filepath.Join(dir, "opt"), PauseImage, b.ContainerdShim, filepath.Join(dir, "runc"), b.Runc,
		cniBinDir, cniConfDir, nriSocketInNamespace, metrics, registryHostsDir(dir))
}
