package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// findCRIORuntime sets the CRI-O runtime's programs: the crio and pinns that
// hack/tools.sh built (CRIOVersion), its runc (RuncVersion), and Debian's
// conmon and skopeo, with an error per missing one that says how to get it.
func findCRIORuntime(cacheDir string, b *Binaries) []error {
	crio := filepath.Join(cacheDir, "crio-"+CRIOVersion)
	b.CRIO = filepath.Join(crio, "crio")
	b.Pinns = filepath.Join(crio, "pinns")
	b.Runc = filepath.Join(cacheDir, "runc-"+RuncVersion, "runc")
	var errs []error
	for _, p := range []string{b.CRIO, b.Pinns} {
		if !executable(p) {
			errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh crio first", p))
		}
	}
	if !executable(b.Runc) {
		errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh runc first", b.Runc))
	}
	for name, dst := range map[string]*string{"conmon": &b.Conmon, "skopeo": &b.Skopeo} {
		p, err := lookPath(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s is not installed: run hack/install-runtime.sh first", name))
			continue
		}
		*dst = p
	}
	return errs
}

// crioFiles are the CRI-O runtime's own configuration files, all under its
// folder: nothing of the host's /etc/containers or /etc/crio is read, so the
// host's own CRI-O or podman (if any) and this cluster never mix. etc is
// bound at /etc/containers in the cluster's mount namespace: CRI-O reads
// registries.conf only there (containers/image ignores
// CONTAINERS_REGISTRIES_CONF, and CRI-O has no setting for it).
type crioFiles struct {
	dir, config, configDir, etc, storage, registries, policy string
}

func newCRIOFiles(dir string) crioFiles {
	etc := filepath.Join(dir, "containers")
	return crioFiles{
		dir:        dir,
		config:     filepath.Join(dir, "crio.conf"),
		configDir:  filepath.Join(dir, "crio.conf.d"),
		etc:        etc,
		storage:    filepath.Join(etc, "storage.conf"),
		registries: filepath.Join(etc, "registries.conf"),
		policy:     filepath.Join(etc, "policy.json"),
	}
}

// etcContainersScript binds f.etc at /etc/containers, for a shell in the
// cluster's mount namespace.
func (f crioFiles) etcContainersScript() string {
	return fmt.Sprintf("mkdir -p %[1]q /etc/containers; mount --bind %[1]q /etc/containers; ", f.etc)
}

// write makes the folders and writes the files, for a CRI-O serving on
// socket, with attach sockets under runDir, that pulls from registryHosts
// over plain HTTP.
func (f crioFiles) write(runDir, socket, cniConfDir string, registryHosts []string, b Binaries) error {
	for _, d := range []string{f.configDir, filepath.Join(f.etc, "registries.conf.d"), filepath.Join(f.dir, "home"), filepath.Join(f.dir, "tmp"), filepath.Join(f.dir, "cdi"), filepath.Join(f.dir, "keys")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("failed to create %s: %w", d, err)
		}
	}
	for path, content := range map[string]string{
		f.config:     crioConfig(f.dir, runDir, socket, cniConfDir, b),
		f.storage:    crioStorageConfig(f.dir),
		f.registries: crioRegistriesConfig(registryHosts),
		f.policy:     crioPolicy,
	} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return fmt.Errorf("failed to write %s: %w", path, err)
		}
	}
	return nil
}

// env points containers/storage, in crio and in skopeo alike, at the
// cluster's storage.conf (also outside the cluster's namespace), and HOME at
// a folder of its own: a per-user registries.conf in root's home would win
// over /etc/containers'.
func (f crioFiles) env() []string {
	return []string{"CONTAINERS_STORAGE_CONF=" + f.storage, "HOME=" + filepath.Join(f.dir, "home")}
}

// crioStorageConfig is containers/storage's configuration, shared by crio
// and by skopeo when it loads an image: the same driver and folders, or
// skopeo's image lands where CRI-O never looks.
func crioStorageConfig(dir string) string {
	return fmt.Sprintf(`[storage]
driver = "overlay"
graphroot = %q
runroot = %q
`, filepath.Join(dir, "storage"), filepath.Join(dir, "storage-run"))
}

// crioRegistriesConfig is containers/image's registries.conf: no search
// registries (every image the cluster runs is named in full) and, with the
// cluster's registry, each of its hosts (loopback, and the bridge address
// pods read it at) over plain HTTP, as containerd's hosts.toml files say
// for the other runtimes.
func crioRegistriesConfig(registryHosts []string) string {
	s := "unqualified-search-registries = []\n"
	for _, host := range registryHosts {
		if host != "" {
			s += fmt.Sprintf("\n[[registry]]\nlocation = %q\ninsecure = true\n", host)
		}
	}
	return s
}

// crioPolicy accepts any image: the cluster pulls only from its own loopback
// registry, and CRI-O refuses every pull without a policy.
const crioPolicy = `{"default": [{"type": "insecureAcceptAnything"}]}` + "\n"

// crioConfig is CRI-O's configuration: the behaviour of the NRI runtime's
// containerd (cgroupfs, the cluster's CNI network, runc of hack/tools.sh, NRI
// on its default socket, bound to the cluster's own folder) with CRI-O's own
// defaults otherwise. Every path is under dir (attach sockets under runDir,
// for the length limit of socket paths), so two clusters and the host never
// share state. NRI is on, as CRI-O ships it; its default validator, which
// enforces the required-plugins pod annotation, is off in CRI-O's defaults
// and turned on here, as docs/runtime-injection.md tells CRI-O users to.
func crioConfig(dir, runDir, socket, cniConfDir string, b Binaries) string {
	return fmt.Sprintf(`[crio]
root = %[1]q
runroot = %[2]q
storage_driver = "overlay"
log_dir = %[3]q
version_file = %[4]q
version_file_persist = %[5]q
clean_shutdown_file = %[6]q

[crio.api]
listen = %[7]q
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
pinns_path = %[8]q
namespaces_dir = %[9]q
container_exits_dir = %[10]q
container_attach_socket_dir = %[11]q
decryption_keys_path = %[12]q
# The host's CDI specs (a GPU node's nvidia.yaml) and OCI hooks are not this
# cluster's: none apply here.
cdi_spec_dirs = [%[13]q]
hooks_dir = []
log_to_journald = false
# CRI-O writes the host's IRQ balancing state for pods that ask for it: in
# the cluster's folder, never the host's /etc/sysconfig.
irqbalance_config_file = %[25]q
irqbalance_config_restore_file = %[26]q

[crio.runtime.runtimes.runc]
runtime_path = %[14]q
runtime_type = "oci"
runtime_root = %[15]q
monitor_path = %[16]q
monitor_cgroup = "pod"

[crio.image]
# The launcher builds and loads this image; nothing can be pulled.
pause_image = %[17]q
pinned_images = [%[17]q]
signature_policy = %[18]q
big_files_temporary_dir = %[19]q

[crio.network]
network_dir = %[20]q
plugin_dirs = [%[21]q]

[crio.nri]
enable_nri = true
nri_listen = %[22]q
nri_plugin_dir = %[23]q
nri_plugin_config_dir = %[24]q

# Refuses a container whose pod names, in
# required-plugins.noderesource.dev/container.<name>, a plugin that is not
# connected: runtime injection relies on it.
[crio.nri.default_validator]
nri_enable_default_validator = true
`,
		filepath.Join(dir, "storage"), filepath.Join(dir, "storage-run"), filepath.Join(dir, "logs"),
		filepath.Join(dir, "version"), filepath.Join(dir, "version-persist"), filepath.Join(dir, "clean.shutdown"),
		socket, b.Pinns, filepath.Join(dir, "ns"), filepath.Join(dir, "exits"), filepath.Join(runDir, "crio-attach"),
		filepath.Join(dir, "keys"), filepath.Join(dir, "cdi"),
		b.Runc, filepath.Join(dir, "runc"), b.Conmon,
		PauseImage, newCRIOFiles(dir).policy, filepath.Join(dir, "tmp"),
		cniConfDir, cniBinDir,
		nriSocketInNamespace, filepath.Join(dir, "nri", "plugins"), filepath.Join(dir, "nri", "conf.d"),
		filepath.Join(dir, "irqbalance"), filepath.Join(dir, "orig_irq_banned_cpus"))
}

// startCRIO writes CRI-O's configuration and starts it with inNS (which
// enters the cluster's mount namespace), and returns once it answers on its
// socket.
func (c *Cluster) startCRIO(ctx context.Context, inNS func(bin string, args ...string) (string, []string), cniConfDir string) (*process, error) {
	f := newCRIOFiles(filepath.Join(c.Dir, "crio"))
	b := c.Binaries
	var err error
	if b.Runc, err = buildRuncCaps(ctx, filepath.Join(f.dir, "bin"), c.Binaries.Runc); err != nil {
		return nil, err
	}
	// relayRegistry has set RegistryPodHost by now: CRI-O reads
	// registries.conf once, at start.
	if err := f.write(c.runDir, c.ContainerdSocket, cniConfDir, []string{c.RegistryHost, c.RegistryPodHost}, b); err != nil {
		return nil, err
	}
	// An empty drop-in folder: the host's /etc/crio/crio.conf.d is not read.
	bin, args := inNS(c.Binaries.CRIO, "--config", f.config, "--config-dir", f.configDir, "--log-level", "info")
	env := append(f.env(), "PATH="+filepath.Dir(c.Binaries.Runc)+":"+os.Getenv("PATH"))
	p, err := c.startWithEnv(RuntimeProcess(RuntimeCRIO), bin, args, env)
	if err != nil {
		return nil, err
	}
	if err := c.poll(ctx, "crio", []string{RuntimeProcess(RuntimeCRIO)}, func(ctx context.Context) (bool, error) {
		_, err := crioInfo(ctx, c.ContainerdSocket)
		return err == nil, nil
	}); err != nil {
		return nil, withLog(err, p)
	}
	floor, err := startOOMFloor(c.NRISocket)
	if err != nil {
		return nil, withLog(err, p)
	}
	c.mu.Lock()
	c.oomFloor = floor
	c.mu.Unlock()
	return p, nil
}

// buildRuncCaps builds e2e/cluster/runccaps into dir, for runc at runc, and
// returns its path: CRI-O's runc in the test cluster. CRI-O gives a
// privileged container every capability the kernel knows, containerd the
// capabilities it holds; where the launcher's root lacks one in its bounding
// set, runc refuses such a container (NVIDIA's device plugin's). The wrapper
// cuts the container's capabilities to its own bounding set, as containerd
// does, and execs runc.
func buildRuncCaps(ctx context.Context, dir, runc string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "runccaps")
	if _, err := os.Stat(filepath.Join(src, "main.go")); !ok || err != nil {
		return "", fmt.Errorf("failed to find e2e/cluster/runccaps's sources (at %s): run from the checkout", src)
	}
	out := filepath.Join(dir, "runc")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-X main.runc="+runc, "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("failed to build runccaps: %w: %s", err, strings.TrimSpace(string(b)))
	}
	return out, nil
}

// oomFloorPlugin is an NRI plugin of the launcher, connected to CRI-O while
// the cluster runs: CRI-O's equivalent of containerd's
// restrict_oom_score_adj, which CRI-O has no setting for. This machine
// refuses to lower a process's oom_score_adj (root lacks CAP_SYS_RESOURCE),
// and the kubelet asks for -997 for node-critical and Guaranteed pods (the
// device plugin's, the chart's): runc then fails with "failed to update
// /proc/self/oom_score_adj: Permission denied". The plugin raises such a
// container's oom_score_adj to the launcher's own, as containerd's setting
// does to containerd's; it changes nothing else, and no pod requires it.
type oomFloorPlugin struct {
	floor  int
	stub   stub.Stub
	cancel context.CancelFunc
}

// oomFloorName is the plugin's NRI name (index 00: before any other plugin).
const oomFloorName = "gi-cluster-oom-score-floor"

func startOOMFloor(socket string) (*oomFloorPlugin, error) {
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return nil, fmt.Errorf("failed to read this process's oom_score_adj: %w", err)
	}
	p := &oomFloorPlugin{}
	if _, err := fmt.Sscan(strings.TrimSpace(string(own)), &p.floor); err != nil {
		return nil, fmt.Errorf("failed to parse oom_score_adj %q: %w", own, err)
	}
	p.stub, err = stub.New(p, stub.WithSocketPath(socket), stub.WithPluginName(oomFloorName), stub.WithPluginIdx("00"))
	if err != nil {
		return nil, fmt.Errorf("failed to create the oom_score_adj floor plugin: %w", err)
	}
	// Its own context: Start's ends when the cluster is up.
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	if err := p.stub.Start(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("failed to connect the oom_score_adj floor plugin to %s: %w", socket, err)
	}
	return p, nil
}

// CreateContainer raises an oom_score_adj below the floor to it.
func (p *oomFloorPlugin) CreateContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	v := ctr.GetLinux().GetOomScoreAdj()
	if v == nil || int(v.GetValue()) >= p.floor {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	floor := p.floor
	adj.SetLinuxOomScoreAdj(&floor)
	return adj, nil, nil
}

func (p *oomFloorPlugin) stop() {
	p.stub.Stop()
	p.cancel()
}

// crioInfo reads CRI-O's /info, which it serves over HTTP on its CRI socket:
// once it answers, the CRI does too.
func crioInfo(ctx context.Context, socket string) (map[string]any, error) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://crio/info", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to ask crio for /info: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("failed to read crio's /info: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("crio's /info: %s: %s", resp.Status, body)
	}
	var info map[string]any
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("failed to decode crio's /info: %w", err)
	}
	return info, nil
}

// importCRIO loads a docker-archive tar into CRI-O's storage with skopeo,
// one copy per tag the archive names, in the cluster's mount namespace
// (containers/storage's overlay driver mounts there, as crio does).
func (c *Cluster) importCRIO(ctx context.Context, tarPath string) error {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil {
		return fmt.Errorf("failed to read the manifest of %s: %w", tarPath, err)
	}
	holder := c.proc("namespace")
	if holder == nil {
		return fmt.Errorf("failed to import image %s: the cluster's mount namespace is not running", tarPath)
	}
	f := newCRIOFiles(filepath.Join(c.Dir, "crio"))
	for _, desc := range m {
		for _, ref := range desc.RepoTags {
			cmd := exec.CommandContext(ctx, c.Binaries.Nsenter, fmt.Sprintf("--mount=/proc/%d/ns/mnt", holder.pid()), "--",
				c.Binaries.Skopeo, "--policy", f.policy, "copy", "--quiet",
				"docker-archive:"+tarPath+":"+ref, "containers-storage:"+ref)
			cmd.Env = append(os.Environ(), f.env()...)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("failed to import image %s (%s): %w: %s", tarPath, ref, err, strings.TrimSpace(string(out)))
			}
		}
	}
	return nil
}

// rootPropagationScript makes the cluster's mount namespace rshared, for a
// shell in it, where the host's / is private (a container, some VMs):
// unshare's slave propagation then leaves every mount of the namespace
// private. CRI-O refuses a hostPath volume with HostToContainer or
// Bidirectional propagation whose source lies on a private mount ("path "/"
// is mounted on "/" but it is not a shared or slave mount"): the chart's
// probe mounts the host's / so. containerd does not check. The namespace's
// mounts form a peer group of their own, so nothing propagates back to the
// host. Empty where the host's / is shared (the namespace's is then a slave).
func rootPropagationScript() string {
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || !rootPrivate(string(mountinfo)) {
		return ""
	}
	return "mount --make-rshared /; "
}

// rootPrivate reports whether /proc/self/mountinfo's mount at / has neither
// shared nor slave propagation (no "shared:" or "master:" optional field);
// of several mounts at /, the last, which hides the others.
func rootPrivate(mountinfo string) bool {
	private := false
	for l := range strings.SplitSeq(mountinfo, "\n") {
		// 36 35 98:0 / / rw,noatime shared:1 - ext3 /dev/root rw
		pre, _, ok := strings.Cut(l, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 6 || f[4] != "/" {
			continue
		}
		private = !slices.ContainsFunc(f[6:], func(o string) bool {
			return strings.HasPrefix(o, "shared:") || strings.HasPrefix(o, "master:")
		})
	}
	return private
}

// hugetlbMountScript mounts cgroup v1's hugetlb controller at
// /sys/fs/cgroup/hugetlb, for a shell in the cluster's mount namespace, where
// the host has the controller (it is in /proc/cgroups) but no hierarchy of
// it mounted, as this project's development machines do; empty otherwise.
// CRI-O takes the controller's presence from /proc/cgroups and sets the
// hugepage limits the kubelet sends for every container (0 for each page
// size), which runc cannot do without the mount ("cannot set hugetlb limit").
// runc looks for it under /sys/fs/cgroup only, so the mount point is made
// there: an empty folder on the host's /sys/fs/cgroup tmpfs stays behind,
// the mount goes with the namespace. containerd is not affected: its CRI
// leaves hugetlb alone by default (disable_hugetlb_controller).
func hugetlbMountScript() string {
	cgroups, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return ""
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || !hugetlbUnmounted(string(cgroups), string(mountinfo)) {
		return ""
	}
	return "mkdir -p /sys/fs/cgroup/hugetlb; mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb; "
}

// hugetlbUnmounted reports whether /proc/cgroups has the hugetlb controller
// enabled while /proc/self/mountinfo, of a cgroup v1 host, has no mount of
// it. On a cgroup v2 host (/sys/fs/cgroup is cgroup2) /proc/cgroups lists
// every controller unmounted, and they are all v2's.
func hugetlbUnmounted(cgroups, mountinfo string) bool {
	if !slices.ContainsFunc(strings.Split(cgroups, "\n"), func(l string) bool {
		f := strings.Fields(l)
		return len(f) == 4 && f[0] == "hugetlb" && f[3] == "1"
	}) {
		return false
	}
	for l := range strings.SplitSeq(mountinfo, "\n") {
		// ... - cgroup cgroup rw,hugetlb
		pre, post, ok := strings.Cut(l, " - ")
		f, p := strings.Fields(post), strings.Fields(pre)
		if !ok || len(f) != 3 || len(p) < 5 {
			continue
		}
		if f[0] == "cgroup2" && p[4] == "/sys/fs/cgroup" {
			return false
		}
		if f[0] == "cgroup" && slices.Contains(strings.Split(f[2], ","), "hugetlb") {
			return false
		}
	}
	return true
}
