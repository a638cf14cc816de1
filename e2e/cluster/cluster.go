// Package cluster starts a real, single-node Kubernetes cluster on this machine:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd and a
// kubelet that runs pods, all on loopback in a temporary folder, with fresh
// certificates. It is what the e2e tests and `make demo` run against. Binaries
// come from hack/tools.sh and hack/install-runtime.sh; with Options.Registry,
// images are pulled from the cluster's own registry on loopback, nowhere else.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultNodeName is the kubelet's node name unless Options say otherwise.
const DefaultNodeName = "gpu-node-1"

// kubeletDevicePluginDir is compiled into the kubelet (deviceplugin/v1beta1
// DevicePluginPath) and ignores --root-dir. The kubelet therefore runs in a
// private mount namespace where this path is a bind mount of the cluster's own
// folder, so two clusters on one machine never share a kubelet.sock.
const kubeletDevicePluginDir = "/var/lib/kubelet/device-plugins"

// Options tune a cluster. The zero value starts the default one-node cluster.
type Options struct {
	// NodeName of the kubelet's Node; DefaultNodeName when empty.
	NodeName string
	// NodeLabels are registered with the Node (kubelet --node-labels).
	NodeLabels map[string]string
	// Runtime is the node's container runtime: RuntimeDebian when empty,
	// RuntimeNRI for containerd 2.x with NRI (Cluster.NRISocket), RuntimeCRIO
	// for CRI-O with NRI.
	Runtime Runtime
	// CacheDir holds the built binaries; CacheDir() when empty.
	CacheDir string
	// ParentDir is where the cluster's temporary folder is made; os.TempDir() when empty.
	ParentDir string
	// LogsDir receives every component's log; <Dir>/logs when empty. Set it
	// to keep logs after Stop removes the folder.
	LogsDir string
	// KeepOnFailure keeps the folder (certificates, configs, logs) when Start
	// fails or the cluster was marked failed; processes are stopped regardless.
	KeepOnFailure bool
	// APIServerFlags are appended to kube-apiserver's flags (a later flag wins).
	APIServerFlags []string
	// ControllerManagerFlags are appended to kube-controller-manager's flags.
	ControllerManagerFlags []string
	// KubeletFlags are appended to the kubelet's flags.
	KubeletFlags []string
	// KubeletConfig may edit the KubeletConfiguration before it is written.
	KubeletConfig func(cfg map[string]any)
	// NodeBinds are folders of this host bound, in the node's mount namespace,
	// over the path each is keyed by (created on the host when missing): what
	// the kubelet, the runtime and every pod's hostPath see there, and no other
	// cluster on this machine.
	NodeBinds map[string]string
	// Registry starts a private registry (the CNCF distribution registry of
	// hack/tools.sh) on loopback, which the node's containerd pulls from:
	// Cluster.RegistryHost.
	Registry bool
	// Timeout bounds Start; 3 minutes when zero.
	Timeout time.Duration
	// Logger receives progress; discarded when unset.
	Logger logr.Logger
}

// Cluster is a running cluster. Stop it, also when a test fails.
type Cluster struct {
	// Dir is the cluster's folder: certificates, configs, state, logs.
	Dir string
	// LogsDir holds one log file per component.
	LogsDir string
	// Kubeconfig is an admin (system:masters) kubeconfig.
	Kubeconfig string
	// APIServerURL is https://127.0.0.1:<port>.
	APIServerURL string
	// CAFile is the cluster CA; it also signs the API server's serving cert.
	CAFile string
	// NodeName is the kubelet's Node.
	NodeName string
	// NodeIP is the Node's InternalIP, where the kubelet serves.
	NodeIP string
	// ContainerdSocket is the node runtime's CRI socket (CRI-O's, for
	// RuntimeCRIO).
	ContainerdSocket string
	// Runtime is the node's container runtime (Options.Runtime, defaulted).
	Runtime Runtime
	// NRISocket is where NRI plugins connect to the node's runtime, as
	// seen from this host (outside the cluster's mount namespace; inside it,
	// and so in pods that mount it as a hostPath, it is /var/run/nri/nri.sock).
	// Empty unless the runtime has NRI (Runtime.HasNRI).
	NRISocket string
	// ContainerdMetricsURL is the NRI runtime's Prometheus endpoint (the
	// CRI's container create and start timers, NRI's plugin latency); empty
	// unless Runtime is RuntimeNRI.
	ContainerdMetricsURL string
	// DevicePluginDir is where a device plugin finds kubelet.sock and puts its
	// own socket (register the socket's base name as the endpoint).
	DevicePluginDir string
	// Binaries are the programs in use; Binaries.Kubectl is handy for tests.
	Binaries Binaries
	// CacheDir holds the built tools (hack/tools.sh), Binaries' among them.
	CacheDir string
	// PodSubnet is the node's pod network (a /24 on the cluster's own bridge);
	// BridgeIP is this host's address on it, from which the API server reaches
	// pods (webhook endpoints) and pods reach the host.
	PodSubnet, BridgeIP string
	// ServiceSubnet is --service-cluster-ip-range; KubernetesServiceIP, its
	// first address, is the "kubernetes" Service's ClusterIP, which pods reach
	// the API server at (see serviceProxy).
	ServiceSubnet, KubernetesServiceIP string
	// RegistryHost is the private registry's 127.0.0.1:<port> (plain HTTP,
	// no authentication), where images pushed are what the node's containerd
	// pulls as RegistryHost/<repository>:<tag>; empty unless Options.Registry.
	RegistryHost string
	// RegistryPodHost is the same registry at this host's bridge address
	// (BridgeIP:<port>), which pods reach as well as the node's runtime:
	// images a webhook reads from inside the cluster are named there.
	RegistryPodHost string
	// Clientset talks to the cluster as admin.
	Clientset *kubernetes.Clientset

	opts       Options
	log        logr.Logger
	restConfig *rest.Config
	pki        *pki
	ports      map[string]int
	bridge     string
	netLock    *os.File
	runDir     string
	apiProxy   *serviceProxy
	// registryProxy relays RegistryPodHost to RegistryHost.
	registryProxy *serviceProxy
	// oomFloor is RuntimeCRIO's NRI plugin of the launcher (oomFloorPlugin).
	oomFloor *oomFloorPlugin
	apiArgs  []string

	mu    sync.Mutex
	procs map[string]*process
	order []string
	mntNS string
	// mntNSPin holds the namespace open until Stop's last sweep, so that
	// its number is never another cluster's (see pinNamespace).
	mntNSPin *os.File
	// configBound is set while containerd's configuration is bound at
	// NodeContainerdConfig in the node's mount namespace (RestartContainerd).
	configBound bool
	failed      bool
	stopped     bool
	stopErr     error
}

// Start brings a cluster up and returns once it is usable: the API server is
// ready, the node is Ready and the default service account exists. On error
// everything started so far is stopped.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if opts.NodeName == "" {
		opts.NodeName = DefaultNodeName
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Minute
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root: containerd, runc and the kubelet mount and make namespaces")
	}
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		if cacheDir, err = CacheDir(); err != nil {
			return nil, err
		}
	}
	if opts.Runtime == "" {
		opts.Runtime = RuntimeDebian
	}
	bins, err := FindRuntimeBinaries(cacheDir, opts.Runtime)
	if err != nil {
		return nil, err
	}
	ip, err := nodeIP()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(opts.ParentDir, "gpu-injector-cluster-")
	if err != nil {
		return nil, fmt.Errorf("failed to create cluster dir: %w", err)
	}
	// containerd and runc reach into this folder as root; others only read it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to chmod cluster dir: %w", err)
	}
	// Unix socket paths are limited to ~104 bytes and Dir may sit deep (a
	// test's TempDir), so the sockets get a short folder of their own.
	runDir, err := os.MkdirTemp("", "gi-run-")
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("failed to create socket dir: %w", err)
	}
	c := &Cluster{
		Dir:              dir,
		runDir:           runDir,
		LogsDir:          opts.LogsDir,
		NodeName:         opts.NodeName,
		NodeIP:           ip,
		ContainerdSocket: filepath.Join(runDir, RuntimeProcess(opts.Runtime)+".sock"),
		Runtime:          opts.Runtime,
		DevicePluginDir:  filepath.Join(runDir, "device-plugins"),
		Binaries:         bins,
		CacheDir:         cacheDir,
		opts:             opts,
		log:              log.WithValues("dir", dir),
		procs:            map[string]*process{},
	}
	if c.LogsDir == "" {
		c.LogsDir = filepath.Join(dir, "logs")
	}
	if c.Runtime.HasNRI() {
		// In the short socket folder: a plugin dials this path from the host.
		c.NRISocket = filepath.Join(runDir, "nri", "nri.sock")
	}
	defer func() {
		if err != nil {
			c.MarkFailed()
			if stopErr := c.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and stopping it: %v)", err, stopErr)
			}
			if opts.KeepOnFailure {
				err = fmt.Errorf("%w (kept %s)", err, dir)
			}
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	start := time.Now()
	c.log.Info("starting local cluster", "node", c.NodeName, "nodeIP", ip, "runtime", c.Runtime)
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"prepare", c.prepare},
		{"registry", c.startRegistry},
		{"control plane", c.startControlPlane},
		{"node", c.startNode},
		{"ready", c.waitUsable},
	} {
		stepStart := time.Now()
		if err := step.fn(ctx); err != nil {
			return nil, fmt.Errorf("failed to start local cluster (%s): %w", step.name, err)
		}
		c.log.V(1).Info("cluster step done", "step", step.name, "duration", time.Since(stepStart).Round(time.Millisecond))
	}
	c.log.Info("local cluster ready", "kubeconfig", c.Kubeconfig, "duration", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// RESTConfig returns a fresh copy of the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// MarkFailed makes Stop keep the folder when Options.KeepOnFailure is set.
func (c *Cluster) MarkFailed() {
	c.mu.Lock()
	c.failed = true
	c.mu.Unlock()
}

// LogPath is the log file of a component: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd (crio, for
// RuntimeCRIO: RuntimeProcess), kubelet.
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.LogsDir, component+".log")
}

func (c *Cluster) prepare(ctx context.Context) error {
	dirs := []string{c.LogsDir, c.DevicePluginDir, filepath.Join(c.Dir, "containerd"), filepath.Join(c.Dir, "kubelet"), filepath.Join(c.Dir, "pod-logs"), filepath.Join(c.Dir, "cni", "net.d")}
	if c.NRISocket != "" {
		dirs = append(dirs, filepath.Dir(c.NRISocket))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("failed to create %s: %w", d, err)
		}
	}
	names := []string{"etcdClient", "etcdPeer", "apiserver", "controllerManager", "scheduler", "kubelet", "kubeletHealthz", "containerdMetrics", "registry"}
	ports, err := freePorts(len(names))
	if err != nil {
		return err
	}
	c.ports = map[string]int{}
	for i, n := range names {
		c.ports[n] = ports[i]
	}
	c.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", c.ports["apiserver"])
	if c.Runtime == RuntimeNRI {
		c.ContainerdMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/v1/metrics", c.ports["containerdMetrics"])
	}
	// One /24 pair per cluster, so two clusters on a machine (two test runs,
	// or the suite beside this package's own tests) neither share a bridge
	// subnet nor a kubernetes Service address.
	n, lock, err := claimNetwork()
	if err != nil {
		return err
	}
	c.netLock = lock
	c.PodSubnet = fmt.Sprintf("10.88.%d.0/24", n)
	c.BridgeIP = fmt.Sprintf("10.88.%d.1", n)
	c.ServiceSubnet = fmt.Sprintf("10.89.%d.0/24", n)
	c.KubernetesServiceIP = fmt.Sprintf("10.89.%d.1", n)

	p, err := newPKI(filepath.Join(c.Dir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	c.CAFile = p.CAFile
	type client struct{ name, cn, org string }
	for _, cl := range []client{
		{"admin", "admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kubelet", "system:node:" + c.NodeName, "system:nodes"},
	} {
		var orgs []string
		if cl.org != "" {
			orgs = []string{cl.org}
		}
		kp, err := p.issue(cl.name, cl.cn, orgs, nil)
		if err != nil {
			return err
		}
		path := filepath.Join(c.Dir, cl.name+".kubeconfig")
		if err := writeKubeconfig(path, c.APIServerURL, p.CAFile, kp, cl.cn); err != nil {
			return err
		}
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("failed to load admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.restConfig = cfg
	if c.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("failed to create clientset: %w", err)
	}
	return nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	p := c.pki
	etcdData := filepath.Join(c.Dir, "etcd")
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcdClient"])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", c.ports["etcdPeer"])
	if _, err := c.start("etcd", c.Binaries.Etcd, []string{
		"--name=default",
		"--data-dir=" + etcdData,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		// A throwaway cluster: durability buys nothing and fsync on a shared
		// disk costs seconds per start.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}); err != nil {
		return err
	}

	serving, err := p.issue("apiserver", "kube-apiserver", nil, []string{
		"127.0.0.1", "localhost", c.NodeIP, c.KubernetesServiceIP,
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	})
	if err != nil {
		return err
	}
	kubeletClient, err := p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil)
	if err != nil {
		return err
	}
	sa, err := p.serviceAccountKeys()
	if err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=" + clientURL,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports["apiserver"]),
		// The in-cluster "kubernetes" Service cannot work without kube-proxy,
		// and a loopback endpoint is invalid, so do not maintain it.
		"--advertise-address=" + c.NodeIP,
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver"),
		"--tls-cert-file=" + serving.CertFile,
		"--tls-private-key-file=" + serving.KeyFile,
		"--client-ca-file=" + p.CAFile,
		"--kubelet-client-certificate=" + kubeletClient.CertFile,
		"--kubelet-client-key=" + kubeletClient.KeyFile,
		"--kubelet-certificate-authority=" + p.CAFile,
		// The Node's Hostname address is its name, which no DNS resolves.
		"--kubelet-preferred-address-types=InternalIP",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + sa.CertFile,
		"--service-account-signing-key-file=" + sa.KeyFile,
		"--service-cluster-ip-range=" + c.ServiceSubnet,
		// The API server calls a webhook Service (and an aggregated API) at one
		// of its ready endpoints rather than at its ClusterIP: Services route
		// with no kube-proxy, iptables or nft, which the GPU machines lack.
		"--enable-aggregator-routing=true",
		"--allow-privileged=true",
		"--profiling=false",
	}
	args = append(args, c.opts.APIServerFlags...)
	c.apiArgs = args
	if err := c.startAPIServer(ctx, args); err != nil {
		return err
	}

	kc := func(name string) string { return filepath.Join(c.Dir, name+".kubeconfig") }
	if _, err := c.start("kube-controller-manager", c.Binaries.ControllerManager, append([]string{
		"--kubeconfig=" + kc("controller-manager"),
		"--authentication-kubeconfig=" + kc("controller-manager"),
		"--authorization-kubeconfig=" + kc("controller-manager"),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports["controllerManager"]),
		"--cert-dir=" + filepath.Join(c.Dir, "controller-manager"),
		"--leader-elect=false",
		// Each controller acts as its own service account, as in kubeadm: the
		// bootstrap RBAC roles are written for that.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + sa.KeyFile,
		"--root-ca-file=" + p.CAFile,
		"--profiling=false",
	}, c.opts.ControllerManagerFlags...)); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", c.Binaries.Scheduler, []string{
		"--kubeconfig=" + kc("scheduler"),
		"--authentication-kubeconfig=" + kc("scheduler"),
		"--authorization-kubeconfig=" + kc("scheduler"),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports["scheduler"]),
		"--cert-dir=" + filepath.Join(c.Dir, "scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	}); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) startAPIServer(ctx context.Context, args []string) error {
	apiserver, err := c.start("kube-apiserver", c.Binaries.APIServer, args)
	if err != nil {
		return err
	}
	c.log.Info("waiting for kube-apiserver", "url", c.APIServerURL)
	err = c.poll(ctx, "kube-apiserver /readyz", []string{"etcd", "kube-apiserver"}, func(ctx context.Context) (bool, error) {
		body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		return withLog(err, apiserver)
	}
	return nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling control-plane
// upgrade does), waits down for the given pause, starts it again with the
// flags it started with, and flags after them (a later flag wins), and waits
// for /readyz. The flags are for this start only: a restart without them
// brings the API server back as it was, as a control plane reconfigured and
// then rolled back would. Everything else keeps running and must reconnect by
// itself.
func (c *Cluster) RestartAPIServer(ctx context.Context, down time.Duration, flags ...string) error {
	p := c.proc("kube-apiserver")
	if p == nil {
		return errors.New("failed to restart kube-apiserver: not running")
	}
	p.stop(30 * time.Second)
	if gone, _ := p.exited(); !gone {
		return fmt.Errorf("failed to stop kube-apiserver (pid %d)", p.pid())
	}
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.startAPIServer(ctx, append(slices.Clip(c.apiArgs), flags...))
}

func (c *Cluster) startNode(ctx context.Context) error {
	// The mount namespace that the runtime (containerd and its shims, or
	// CRI-O and its conmons) and the kubelet share: it gives the kubelet a
	// private device-plugin folder, and every mount they make (rootfs
	// overlays, projected volumes, netns files) vanishes with it. Slave
	// propagation still shows them the host's later mounts. With NRI, NRI's
	// socket folder is the cluster's own too: plugins (and pods mounting
	// /var/run/nri/nri.sock) reach this cluster's runtime, never another's.
	ready := filepath.Join(c.Dir, "namespace.ready")
	binds := fmt.Sprintf("mkdir -p %[1]s; mount --bind %[2]q %[1]s; ", kubeletDevicePluginDir, c.DevicePluginDir)
	if c.NRISocket != "" {
		binds += fmt.Sprintf("mkdir -p %[1]s; mount --bind %[2]q %[1]s; ", nriDirInNamespace, filepath.Dir(c.NRISocket))
	}
	for _, dst := range slices.Sorted(maps.Keys(c.opts.NodeBinds)) {
		binds += fmt.Sprintf("mkdir -p %[1]q; mount --bind %[2]q %[1]q; ", dst, c.opts.NodeBinds[dst])
	}
	if c.Runtime == RuntimeCRIO {
		binds += newCRIOFiles(filepath.Join(c.Dir, "crio")).etcContainersScript()
		binds += hugetlbMountScript()
		binds += rootPropagationScript()
	}
	script := fmt.Sprintf("set -e; %s touch %q; exec sleep infinity", binds, ready)
	holder, err := c.start("namespace", c.Binaries.Unshare, []string{"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", script})
	if err != nil {
		return err
	}
	if err := c.poll(ctx, "private mount namespace", []string{"namespace"}, func(context.Context) (bool, error) {
		_, err := os.Stat(ready)
		return err == nil, nil
	}); err != nil {
		return withLog(err, holder)
	}
	pin, ns, err := pinNamespace(holder.pid())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.mntNS, c.mntNSPin = ns, pin
	c.mu.Unlock()
	inNS := func(bin string, args ...string) (string, []string) {
		return c.Binaries.Nsenter, append([]string{fmt.Sprintf("--mount=/proc/%d/ns/mnt", holder.pid()), "--", bin}, args...)
	}

	suffix := randomHex(3)
	c.bridge = "gi" + suffix
	// The bridge exists, with this host's address, before any pod: the API
	// server reaches pod IPs through it, pods reach this host (and the
	// kubernetes Service address) through it. Neither forwarding nor NAT.
	if err := createBridge(c.bridge, c.BridgeIP+"/24", c.KubernetesServiceIP+"/32"); err != nil {
		return err
	}
	proxy, err := startServiceProxy(c.KubernetesServiceIP+":443", fmt.Sprintf("127.0.0.1:%d", c.ports["apiserver"]))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiProxy = proxy
	c.mu.Unlock()
	if err := c.relayRegistry(); err != nil {
		return err
	}
	cniDir := filepath.Join(c.Dir, "cni")
	conf, err := cniConfig("gpu-injector-"+suffix, c.bridge, c.PodSubnet, c.BridgeIP, filepath.Join(cniDir, "ipam"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniDir, "net.d", "10-bridge.conflist"), conf, 0o644); err != nil {
		return fmt.Errorf("failed to write cni config: %w", err)
	}
	var runtime *process
	if c.Runtime == RuntimeCRIO {
		runtime, err = c.startCRIO(ctx, inNS, filepath.Join(cniDir, "net.d"))
	} else {
		runtime, err = c.startContainerd(ctx, inNS, filepath.Join(cniDir, "net.d"))
	}
	if err != nil {
		return err
	}
	pause, err := buildPause(ctx, filepath.Join(c.Dir, "images"), PauseImage)
	if err != nil {
		return err
	}
	if err := c.ImportImage(ctx, pause); err != nil {
		return withLog(err, runtime)
	}

	kubeletTLS, err := c.pki.issue("kubelet-serving", "system:node:"+c.NodeName, []string{"system:nodes"}, []string{c.NodeIP, "127.0.0.1", c.NodeName})
	if err != nil {
		return err
	}
	cfg := kubeletConfig(c, c.ports, kubeletTLS, c.CAFile)
	if c.opts.KubeletConfig != nil {
		c.opts.KubeletConfig(cfg)
	}
	cfgPath := filepath.Join(c.Dir, "kubelet-config.yaml")
	if err := writeYAML(cfgPath, cfg); err != nil {
		return err
	}
	kargs := []string{
		"--config=" + cfgPath,
		"--kubeconfig=" + filepath.Join(c.Dir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(c.Dir, "kubelet"),
		"--cert-dir=" + filepath.Join(c.Dir, "kubelet", "pki"),
		"--hostname-override=" + c.NodeName,
		"--node-ip=" + c.NodeIP,
		"--v=2",
	}
	if len(c.opts.NodeLabels) > 0 {
		kargs = append(kargs, "--node-labels="+joinLabels(c.opts.NodeLabels))
	}
	kargs = append(kargs, c.opts.KubeletFlags...)
	bin, args := inNS(c.Binaries.Kubelet, kargs...)
	if _, err := c.start("kubelet", bin, args); err != nil {
		return err
	}
	return nil
}

// startContainerd writes containerd's configuration (1.6's, or 2.x's with NRI
// for RuntimeNRI) and starts it with inNS (which enters the cluster's mount
// namespace), and returns once it answers on its socket.
func (c *Cluster) startContainerd(ctx context.Context, inNS func(bin string, args ...string) (string, []string), cniConfDir string) (*process, error) {
	ctrdDir := filepath.Join(c.Dir, "containerd")
	ctrdConf := filepath.Join(ctrdDir, "config.toml")
	ctrdConfig := containerdConfig(ctrdDir, c.ContainerdSocket, cniConfDir)
	var ctrdEnv []string
	if c.Runtime == RuntimeNRI {
		ctrdConfig = containerdNRIConfig(ctrdDir, c.ContainerdSocket, fmt.Sprintf("127.0.0.1:%d", c.ports["containerdMetrics"]), cniConfDir, c.Binaries)
		// The config names the shim and runc; PATH says the same to anything
		// that looks them up by name, so Debian's never mix in.
		ctrdEnv = []string{"PATH=" + filepath.Dir(c.Binaries.ContainerdShim) + ":" + filepath.Dir(c.Binaries.Runc) + ":" + os.Getenv("PATH")}
	}
	if err := os.WriteFile(ctrdConf, []byte(ctrdConfig), 0o644); err != nil {
		return nil, fmt.Errorf("failed to write containerd config: %w", err)
	}
	bin, args := inNS(c.Binaries.Containerd, "--config", ctrdConf, "--log-level", "info")
	containerd, err := c.startWithEnv("containerd", bin, args, ctrdEnv)
	if err != nil {
		return nil, err
	}
	if err := c.poll(ctx, "containerd", []string{"containerd"}, func(ctx context.Context) (bool, error) {
		return exec.CommandContext(ctx, c.Binaries.Ctr, "--address", c.ContainerdSocket, "version").Run() == nil, nil
	}); err != nil {
		return nil, withLog(err, containerd)
	}
	return containerd, nil
}

func (c *Cluster) waitUsable(ctx context.Context) error {
	all := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", RuntimeProcess(c.Runtime), "kubelet"}
	c.log.Info("waiting for node to be ready", "node", c.NodeName)
	if err := c.poll(ctx, "node "+c.NodeName+" Ready", all, func(ctx context.Context) (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		return withLog(err, c.proc("kubelet"))
	}
	c.log.Info("waiting for default service account and root CA")
	if err := c.poll(ctx, "default service account and kube-root-ca.crt", all, func(ctx context.Context) (bool, error) {
		// Errors are NotFound or transient while the control plane settles.
		if _, err := c.Clientset.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := c.Clientset.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return withLog(err, c.proc("kube-controller-manager"))
	}
	// The scheduler has no API object to wait on; its health endpoint says it
	// has synced its informers and can bind pods.
	healthz := fmt.Sprintf("https://127.0.0.1:%d/healthz", c.ports["scheduler"])
	if err := c.poll(ctx, "kube-scheduler /healthz", all, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, healthz), nil
	}); err != nil {
		return withLog(err, c.proc("kube-scheduler"))
	}
	return nil
}

// ImportImage loads a docker-archive tar (see BuildImage) into the node's
// runtime, where pods with imagePullPolicy Never find it.
func (c *Cluster) ImportImage(ctx context.Context, tarPath string) error {
	if c.Runtime == RuntimeCRIO {
		return c.importCRIO(ctx, tarPath)
	}
	out, err := exec.CommandContext(ctx, c.Binaries.Ctr, "--address", c.ContainerdSocket, "--namespace", "k8s.io",
		"images", "import", tarPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("failed to import image %s: %w: %s", tarPath, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SignalContainer sends a signal (SIGHUP, SIGKILL, ...) to the main process
// of the container whose status names containerID (containerd://<id> or
// cri-o://<id>): through containerd's task API, or, for CRI-O, through the
// runc that runs it, as an OOM kill or `crictl stop` would reach it.
func (c *Cluster) SignalContainer(ctx context.Context, containerID, signal string) error {
	scheme, id, ok := strings.Cut(containerID, "://")
	if !ok || id == "" {
		return fmt.Errorf("failed to signal container %q: not a runtime's <scheme>://<id>", containerID)
	}
	var cmd *exec.Cmd
	switch {
	case scheme == "cri-o" && c.Runtime == RuntimeCRIO:
		cmd = exec.CommandContext(ctx, c.Binaries.Runc, "--root", filepath.Join(c.Dir, "crio", "runc"), "kill", id, signal)
	case scheme == "containerd" && c.Runtime != RuntimeCRIO:
		cmd = exec.CommandContext(ctx, c.Binaries.Ctr, "--address", c.ContainerdSocket, "--namespace", "k8s.io",
			"tasks", "kill", "--signal", signal, id)
	default:
		return fmt.Errorf("failed to signal container %q: not one of this node's %s runtime", containerID, c.Runtime)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to signal container %s: %w: %s", containerID, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// BuildImage writes an image named ref from files (container path -> host
// path) under the cluster's folder and returns the tar's path; ImportImage
// loads it. See WriteImage for how files are copied.
func (c *Cluster) BuildImage(ref string, files map[string]string) (string, error) {
	return c.BuildImageWithConfig(ref, files, ImageConfig{})
}

// BuildImageWithConfig is BuildImage with an entrypoint or environment.
func (c *Cluster) BuildImageWithConfig(ref string, files map[string]string, cfg ImageConfig) (string, error) {
	name := strings.NewReplacer("/", "_", ":", "_", "@", "_").Replace(ref)
	tarPath := filepath.Join(c.Dir, "images", name+".tar")
	if err := WriteImage(tarPath, ref, files, cfg); err != nil {
		return "", err
	}
	return tarPath, nil
}

// start runs one component and records it for Stop.
func (c *Cluster) start(name, bin string, args []string) (*process, error) {
	return c.startWithEnv(name, bin, args, nil)
}

// startWithEnv is start with env added to this process's environment (a
// later entry wins).
func (c *Cluster) startWithEnv(name, bin string, args, env []string) (*process, error) {
	c.log.V(1).Info("starting component", "component", name)
	p, err := startProcess(c.LogsDir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs[name] = p
	c.order = append(c.order, name)
	c.mu.Unlock()
	return p, nil
}

func (c *Cluster) proc(name string) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

// poll runs cond every 250ms until it holds, ctx ends, or one of the watched
// processes exits, which fails at once with that process's log.
func (c *Cluster) poll(ctx context.Context, what string, watch []string, cond func(context.Context) (bool, error)) error {
	var died error
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, name := range watch {
			if p := c.proc(name); p != nil {
				if gone, err := p.exited(); gone {
					died = withLog(err, p)
					return false, died
				}
			}
		}
		return cond(ctx)
	})
	if died != nil {
		return fmt.Errorf("failed waiting for %s: %w", what, died)
	}
	if err != nil {
		return fmt.Errorf("failed waiting for %s: %w", what, err)
	}
	return nil
}

// Stop stops every process the cluster started, containers included, and
// removes its folder (kept when Options.KeepOnFailure is set and the cluster
// failed). Safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return c.stopErr
	}
	c.stopped = true
	mntNS := c.mntNS
	c.mu.Unlock()

	var errs []error
	grace := 10 * time.Second
	// The kubelet first, so it does not restart what is killed next.
	if p := c.proc("kubelet"); p != nil {
		p.stop(grace)
	}
	// Netns files containerd bind-mounted in the namespace: after the kill
	// their mounts are gone but the empty files stay on the host's /run.
	netns := c.namespaceNetns()
	if mntNS != "" {
		// Containers and shims live in (or below) the cluster's namespace;
		// containerd and the holder are stopped by their own PIDs below.
		pids, err := namespaceProcesses(mntNS)
		if err != nil {
			errs = append(errs, err)
		}
		own := map[int]bool{}
		for _, name := range []string{RuntimeProcess(c.Runtime), "namespace"} {
			if p := c.proc(name); p != nil {
				own[p.pid()] = true
			}
		}
		var victims []int
		for _, pid := range pids {
			if !own[pid] {
				victims = append(victims, pid)
			}
		}
		if err := killAll(victims, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("failed to kill containers: %w", err))
		}
	}
	c.mu.Lock()
	floor := c.oomFloor
	c.mu.Unlock()
	if floor != nil {
		floor.stop()
	}
	// Then the rest, newest first.
	c.mu.Lock()
	order := append([]string(nil), c.order...)
	c.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		if p := c.proc(order[i]); p != nil {
			p.stop(grace)
			if gone, _ := p.exited(); !gone {
				errs = append(errs, fmt.Errorf("%s (pid %d) did not exit", p.name, p.pid()))
			}
		}
	}
	if mntNS != "" {
		// Until containerd stopped, a shim could still start a process (a
		// runc cleaning up the containers just killed): sweep once more,
		// now that nothing can start another.
		pids, err := namespaceProcesses(mntNS)
		if err != nil {
			errs = append(errs, err)
		}
		if err := killAll(pids, 10*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("failed to kill what containerd left: %w", err))
		}
	}
	c.mu.Lock()
	if c.mntNSPin != nil {
		// Only now may the namespace go, and its number with it.
		c.mntNSPin.Close()
		c.mntNSPin = nil
	}
	c.mu.Unlock()
	for _, f := range netns {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", f, err))
		}
	}
	c.mu.Lock()
	proxy := c.apiProxy
	c.mu.Unlock()
	if err := proxy.close(); err != nil {
		errs = append(errs, fmt.Errorf("failed to stop the kubernetes Service relay: %w", err))
	}
	c.mu.Lock()
	proxy = c.registryProxy
	c.mu.Unlock()
	if err := proxy.close(); err != nil {
		errs = append(errs, fmt.Errorf("failed to stop the registry's relay: %w", err))
	}
	if c.bridge != "" {
		// Ours by its random name.
		if err := deleteLink(c.bridge); err != nil {
			errs = append(errs, err)
		}
	}
	if c.netLock != nil {
		// Only once the bridge and the relay are gone: the next cluster may
		// take the addresses at once.
		c.netLock.Close()
		c.netLock = nil
	}
	errs = append(errs, c.removeContainerLogLinks())
	if err := unmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	}

	c.mu.Lock()
	keep := c.failed && c.opts.KeepOnFailure
	c.mu.Unlock()
	if keep {
		c.log.Info("kept cluster folder", "dir", c.Dir)
	} else if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", c.Dir, err))
		}
	}
	// Sockets only; nothing to keep for debugging.
	if err := unmountUnder(c.runDir); err != nil {
		errs = append(errs, err)
	}
	if c.runDir != "" {
		if err := os.RemoveAll(c.runDir); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", c.runDir, err))
		}
	}
	err := errors.Join(errs...)
	c.mu.Lock()
	c.stopErr = err
	c.mu.Unlock()
	c.log.Info("local cluster stopped", "error", err)
	return err
}

// namespaceNetns lists the network namespace files mounted in the cluster's
// mount namespace (containerd's /var/run/netns/cni-...).
func (c *Cluster) namespaceNetns() []string {
	holder := c.proc("namespace")
	if holder == nil {
		return nil
	}
	if gone, _ := holder.exited(); gone {
		return nil
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.pid()))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if strings.HasPrefix(mp, "/run/netns/cni-") || strings.HasPrefix(mp, "/var/run/netns/cni-") {
			out = append(out, mp)
		}
	}
	return out
}

// removeContainerLogLinks removes the links the kubelet made in the fixed
// /var/log/containers that point into this cluster's folder.
func (c *Cluster) removeContainerLogLinks() error {
	const dir = "/var/log/containers"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, c.Dir+string(filepath.Separator)) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount below dir in this mount namespace, deepest
// first. The components mount inside their private namespace, so this finds
// nothing unless something escaped it; it is the last guard before RemoveAll.
func unmountUnder(dir string) error {
	if dir == "" {
		return nil
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("failed to read mountinfo: %w", err)
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	var errs []error
	for _, mp := range mounts {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("failed to unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func joinLabels(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// networkLockDir holds one lock file per claimed /24 pair; the kernel drops
// a lock when its holder dies, so a crashed run frees its pair.
const networkLockDir = "/run/lock/gpu-injector-networks"

// claimNetwork picks a free N for 10.88.N.0/24 (pods) and 10.89.N.0/24
// (Services), in random order, and holds it by a lock until the cluster
// stops. Picking at random alone let two clusters started together share
// one N now and then (1 in 256 for each pair): the second then failed to
// bind the kubernetes Service address. N is also skipped while any
// interface still has one of its addresses (what a killed run left).
func claimNetwork() (int, *os.File, error) {
	if err := os.MkdirAll(networkLockDir, 0o755); err != nil {
		return 0, nil, fmt.Errorf("failed to create %s: %w", networkLockDir, err)
	}
	inUse, err := hostAddresses()
	if err != nil {
		return 0, nil, err
	}
	for _, n := range mathrand.Perm(254) {
		n++ // 1..254
		if inUse[fmt.Sprintf("10.88.%d.1", n)] || inUse[fmt.Sprintf("10.89.%d.1", n)] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(networkLockDir, strconv.Itoa(n)+".lock"), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o644)
		if err != nil {
			return 0, nil, fmt.Errorf("failed to open a network lock: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return n, f, nil
	}
	return 0, nil, errors.New("failed to find a free 10.88.N.0/24 for the cluster: all 254 are in use")
}

// hostAddresses are the IPv4 addresses of this host's interfaces.
func hostAddresses() (map[string]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("failed to list this host's addresses: %w", err)
	}
	out := map[string]bool{}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			out[ipn.IP.String()] = true
		}
	}
	return out, nil
}
