package cluster

import (
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"
)

// versionsFile is the one place the tools' versions are set; hack/tools.sh
// builds from it too.
//
//go:embed versions.env
var versionsFile string

// Versions the launcher runs: versions.env's, or the environment's
// (KUBERNETES_VERSION=v1.33.13 runs the e2e suite on that release, as
// `make e2e K8S_VERSION=v1.33.13` does).
var (
	EtcdVersion               = version("ETCD_VERSION")
	KubernetesVersion         = version("KUBERNETES_VERSION")
	HelmVersion               = version("HELM_VERSION")
	NvidiaDevicePluginVersion = version("NVIDIA_DEVICE_PLUGIN_VERSION")
	// ContainerdVersion and RuncVersion are RuntimeNRI's runtime.
	ContainerdVersion = version("CONTAINERD_VERSION")
	RuncVersion       = version("RUNC_VERSION")
	// CRIOVersion is RuntimeCRIO's CRI-O; it runs RuncVersion's runc.
	CRIOVersion = version("CRIO_VERSION")
	// NvidiaContainerToolkitVersion is the toolkit runtime's
	// (ToolkitRuntime), built by hack/tools.sh nvidia-container-toolkit.
	NvidiaContainerToolkitVersion = version("NVIDIA_CONTAINER_TOOLKIT_VERSION")
)

// releaseVersion is how every tool names a release: v1.37.2, never 1.37.2.
var releaseVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

func version(name string) string {
	v := os.Getenv(name)
	if v == "" {
		for line := range strings.SplitSeq(versionsFile, "\n") {
			if k, fv, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k == name {
				v = fv
			}
		}
	}
	if !releaseVersion.MatchString(v) {
		panic(fmt.Sprintf("%s=%q (the environment's, else versions.env's) is not a release such as v1.37.2", name, v))
	}
	return v
}

// Binaries are the paths of every program the cluster runs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, Scheduler, Kubelet, Kubectl string
	Containerd, Ctr, Runc, Unshare, Nsenter                         string
	// ContainerdShim is RuntimeNRI's containerd-shim-runc-v2; empty for
	// RuntimeDebian, whose containerd finds its own on PATH.
	ContainerdShim string
	// CRIO and Pinns are RuntimeCRIO's, from hack/tools.sh; Conmon and Skopeo
	// the host's (hack/install-runtime.sh). Empty for the other runtimes.
	CRIO, Pinns, Conmon, Skopeo string
}

// CacheDir is where hack/tools.sh puts binaries: $GPU_INJECTOR_CACHE, else
// gpu-injector/ in the user's cache folder ($XDG_CACHE_HOME, else ~/.cache),
// outside any clone.
func CacheDir() (string, error) {
	if d := os.Getenv("GPU_INJECTOR_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("failed to find the cache folder of hack/tools.sh (set GPU_INJECTOR_CACHE): %w", err)
	}
	return filepath.Join(d, "gpu-injector"), nil
}

// FindBinaries locates every program of a RuntimeDebian cluster, with an
// error that says how to get the missing ones.
func FindBinaries(cacheDir string) (Binaries, error) {
	return FindRuntimeBinaries(cacheDir, RuntimeDebian)
}

// FindRuntimeBinaries is FindBinaries for a cluster whose node runs runtime
// ("" is RuntimeDebian). For RuntimeNRI, containerd, its shim, ctr and runc
// are the ones hack/tools.sh built; for RuntimeCRIO, crio, pinns and runc are,
// conmon and skopeo the host's; the CNI plugins, unshare and nsenter are the
// host's either way.
func FindRuntimeBinaries(cacheDir string, runtime Runtime) (Binaries, error) {
	if runtime == "" {
		runtime = RuntimeDebian
	}
	if err := runtime.valid(); err != nil {
		return Binaries{}, err
	}
	k8s := filepath.Join(cacheDir, "kubernetes-"+KubernetesVersion)
	b := Binaries{
		Etcd:              filepath.Join(cacheDir, "etcd-"+EtcdVersion, "etcd"),
		APIServer:         filepath.Join(k8s, "kube-apiserver"),
		ControllerManager: filepath.Join(k8s, "kube-controller-manager"),
		Scheduler:         filepath.Join(k8s, "kube-scheduler"),
		Kubelet:           filepath.Join(k8s, "kubelet"),
		Kubectl:           filepath.Join(k8s, "kubectl"),
	}
	var errs []error
	for _, p := range []string{b.APIServer, b.ControllerManager, b.Scheduler, b.Kubelet, b.Kubectl} {
		if !executable(p) {
			errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh kubernetes first", p))
		}
	}
	if !executable(b.Etcd) {
		errs = append(errs, fmt.Errorf("%s is missing: run hack/tools.sh etcd first", b.Etcd))
	}
	hostPrograms := map[string]*string{"unshare": &b.Unshare, "nsenter": &b.Nsenter}
	switch runtime {
	case RuntimeNRI:
		errs = append(errs, findNRIRuntime(cacheDir, &b)...)
	case RuntimeCRIO:
		errs = append(errs, findCRIORuntime(cacheDir, &b)...)
	default:
		hostPrograms["containerd"], hostPrograms["ctr"], hostPrograms["runc"] = &b.Containerd, &b.Ctr, &b.Runc
	}
	for name, dst := range hostPrograms {
		p, err := lookPath(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s is not installed: run hack/install-runtime.sh first", name))
			continue
		}
		*dst = p
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if !executable(filepath.Join(cniBinDir, p)) {
			errs = append(errs, fmt.Errorf("CNI plugin %s is missing from %s: run hack/install-runtime.sh first", p, cniBinDir))
		}
	}
	return b, errors.Join(errs...)
}

// cniBinDir is where Debian's containernetworking-plugins installs.
const cniBinDir = "/usr/lib/cni"

// lookPath is exec.LookPath plus the sbin folders, which a non-login root shell
// may lack on its PATH.
func lookPath(name string) (string, error) {
	for _, dir := range append(filepath.SplitList(os.Getenv("PATH")), "/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin") {
		p := filepath.Join(dir, name)
		if executable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find %s", name)
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// freePorts reserves n distinct loopback TCP ports. They are released before the
// components bind them; the window is short and each cluster asks the kernel, so
// two clusters on one machine do not pick the same set.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("failed to reserve a port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// nodeIP is the address the kubelet reports and serves on. The kubelet refuses a
// loopback node IP, so take the source address of the default route, else the
// first global IPv4 address.
func nodeIP() (string, error) {
	if c, err := net.Dial("udp4", "192.0.2.254:9"); err == nil {
		ip := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		if !ip.IsLoopback() {
			return ip.String(), nil
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("failed to list interface addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("failed to find a non-loopback IPv4 address for the node")
}

// writeKubeconfig writes a kubeconfig for one client certificate.
func writeKubeconfig(path, server, caFile string, kp keyPair, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: kp.CertFile, ClientKey: kp.KeyFile}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("failed to write kubeconfig %s: %w", path, err)
	}
	return nil
}

// containerdConfig is the runtime's config: everything under dir, so two
// clusters and the host's own containerd never share state.
func containerdConfig(dir, socket, cniConfDir string) string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  # This machine refuses to lower oom_score_adj; without this every sandbox
  # fails with runc's "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q

  # Registry hosts (hosts.toml per host), as for a private registry: the
  # cluster's own when Options.Registry is set.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[10]q
`,
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), socket, socket+".ttrpc",
		filepath.Join(dir, "opt"), PauseImage, filepath.Join(dir, "runc"), cniBinDir, cniConfDir, registryHostsDir(dir))
}

// PauseImage is the sandbox image containerd 1.6 expects; the launcher builds a
// local one, as nothing can be pulled.
const PauseImage = "registry.k8s.io/pause:3.6"

// cniConfig is a bridge network private to one cluster: its own bridge name,
// subnet and IPAM folder. The launcher made the bridge and gave it this host's
// address (gateway); isGateway stays false because with it the bridge plugin
// turns on the host's IP forwarding, a machine-wide change. No masquerade:
// pods talk to this host only.
func cniConfig(name, bridge, subnet, gateway, ipamDir string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       name,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      bridge,
				"isGateway":   false,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": subnet, "gateway": gateway}}},
					// Everything off the pod subnet goes to this host's
					// address on the bridge: the kubernetes Service address
					// is local there. The host forwards nothing further.
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": ipamDir,
				},
			},
		},
	}
	data, err := yaml.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("failed to encode cni config: %w", err)
	}
	return yaml.YAMLToJSON(data)
}

// kubeletConfig is the KubeletConfiguration verified on these machines (see
// docs/local-cluster.md), as a map so Options.KubeletConfig can edit any field.
func kubeletConfig(c *Cluster, ports map[string]int, kubeletTLS keyPair, caFile string) map[string]any {
	return map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// The API server reaches the kubelet (logs, exec) at the node IP; clients
		// must present a certificate of the cluster CA and pass a
		// SubjectAccessReview, so nothing is open to other users of the machine.
		"address":            c.NodeIP,
		"port":               ports["kubelet"],
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        ports["kubeletHealthz"],
		"tlsCertFile":        kubeletTLS.CertFile,
		"tlsPrivateKeyFile":  kubeletTLS.KeyFile,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": caFile},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"containerRuntimeEndpoint": "unix://" + c.ContainerdSocket,
		// cgroup v1 without systemd: what these machines have.
		"cgroupDriver":           "cgroupfs",
		"failCgroupV1":           false,
		"cgroupsPerQOS":          false,
		"enforceNodeAllocatable": []string{},
		"failSwapOn":             false,
		// No eviction and no image GC: test images cannot be pulled again, and a
		// busy shared disk must not evict the pods under test.
		"evictionHard":                map[string]string{},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"podLogsDir":                  filepath.Join(c.Dir, "pod-logs"),
		"volumePluginDir":             filepath.Join(c.Dir, "kubelet", "volume-plugins"),
		"clusterDomain":               "cluster.local",
		"resolvConf":                  "/etc/resolv.conf",
		"registerNode":                true,
		"serializeImagePulls":         false,
		"nodeStatusUpdateFrequency":   "2s",
		"nodeStatusReportFrequency":   "10s",
	}
}

func writeYAML(path string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("failed to encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	return nil
}
