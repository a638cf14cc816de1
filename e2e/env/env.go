// Package env brings up the whole gpu-injector environment on this machine,
// for the e2e suite and for `make demo`: a real local cluster (etcd,
// kube-apiserver, scheduler, controller-manager, containerd and one kubelet),
// a stand-in NVIDIA driver in a classic layout on the kubelet node and two more
// GPU nodes as API objects with the other classic layouts, NVIDIA's device
// plugin as a DaemonSet pod on the kubelet node, and gpu-injector installed as
// a user does: `make image`'s image imported into the node's
// containerd and `helm install` of the chart with only the image values. The
// kubelet runs the chart's webhook Deployment and probe DaemonSet; the API
// server calls the webhook through its Service. The API-only nodes have no
// kubelet, so their probes run as local processes of the same binary with
// node-bound tokens of the chart's probe service account. Nothing in it is a
// fake of gpu-injector: only the GPUs are stand-ins, and they say so.
package env

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/deviceplugin"
	"github.com/gpu-injector/gpu-injector/e2e/standin"
	"github.com/gpu-injector/gpu-injector/e2e/workloads"
	"github.com/gpu-injector/gpu-injector/layout"
)

// WorkloadImage runs cuda-check (at workloads.CUDACheck) and holds glibc and
// the loader, and no driver file; PATH names the injected driver folder.
const WorkloadImage = "gpu-injector.local/cuda-check:e2e"

// Options tune Up. The zero value is the standard environment.
type Options struct {
	// Progress receives one line per step; os.Stderr when nil.
	Progress io.Writer
	// Logger receives the cluster launcher's log; discarded when unset.
	Logger logr.Logger
	// KeepOnFailure keeps the environment's folder (logs, certificates,
	// kubeconfigs) when Up fails or MarkFailed was called.
	KeepOnFailure bool
	// ChartValues are extra `helm install --set` values for the chart, after
	// the image values (HelmValues).
	ChartValues []string
	// Timeout bounds Up once the binaries are built; 6 minutes when zero.
	Timeout time.Duration
	// Runtime is the kubelet node's container runtime; the Debian containerd
	// (no NRI) when empty.
	Runtime cluster.Runtime
}

// Env is a running environment. Call Down, also after a failure.
type Env struct {
	// Dir holds everything the environment wrote: logs/, fake node roots,
	// certificates, kubeconfigs, the built binary and images.
	Dir     string
	LogsDir string
	// RepoRoot is the gpu-injector checkout the binary was built from.
	RepoRoot string
	// Binary is the gpu-injector binary the API-only nodes' probes run (and
	// `gpu-injector mutate` for the demo); ImageLayout is `make image`'s
	// image of the same source (an OCI image layout), which the environment
	// pushes to the cluster's registry (ImageRef) and the kubelet pulls.
	Binary      string
	ImageLayout string
	Cluster     *cluster.Cluster
	// Clientset talks to the cluster as admin.
	Clientset *kubernetes.Clientset
	// Kubeconfig is an admin kubeconfig; Kubectl and Helm are the binaries.
	Kubeconfig string
	Kubectl    string
	Helm       string
	Applier    *Applier
	// Nodes are the simulated GPU nodes, the kubelet node first.
	Nodes []*Node
	// ConfigFile is the release's config.yaml (its ConfigMap), which the
	// API-only nodes' probes read.
	ConfigFile string
	// WebhookSA and ProbeSA are the chart's service accounts, in Namespace.
	WebhookSA, ProbeSA string
	// AuditLog is the API server's audit log of every write to Nodes (JSON
	// lines; see NodeWrites).
	AuditLog string
	// ImageFiles are the container paths in WorkloadImage.
	ImageFiles []string

	opts     Options
	out      io.Writer
	start    time.Time
	standins *standin.Cache
	// host is this environment's part in what the machine's environments share.
	host *hostShare

	mu           sync.Mutex
	failed       bool
	localMetrics string
	downOnce     sync.Once
	downErr      error
}

// Up builds gpu-injector, starts the cluster and everything on it, and
// returns once the webhook knows every node's published layout. On error
// everything started so far is stopped.
func Up(ctx context.Context, opts Options) (_ *Env, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the e2e environment needs root: the kubelet, containerd and the stand-in driver under /home/kubernetes")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 6 * time.Minute
	}
	out := opts.Progress
	if out == nil {
		out = os.Stderr
	}
	e := &Env{opts: opts, out: out, start: time.Now()}
	if e.RepoRoot, err = repoRoot(); err != nil {
		return nil, err
	}
	if e.Dir, err = os.MkdirTemp("", "gpu-injector-env-"); err != nil {
		return nil, fmt.Errorf("failed to create the environment folder: %w", err)
	}
	defer func() {
		if err != nil {
			e.MarkFailed()
			if downErr := e.Down(); downErr != nil {
				err = fmt.Errorf("%w (and stopping it: %v)", err, downErr)
			}
			if opts.KeepOnFailure {
				err = fmt.Errorf("%w (kept %s)", err, e.Dir)
			}
		}
	}()
	if err := os.Chmod(e.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to chmod %s: %w", e.Dir, err)
	}
	e.LogsDir = filepath.Join(e.Dir, "logs")
	if err := os.MkdirAll(e.LogsDir, 0o755); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", e.LogsDir, err)
	}
	e.standins = &standin.Cache{Dir: filepath.Join(e.Dir, "standin-build")}
	e.Nodes = defaultNodes()

	// Outside Timeout: a first build compiles client-go and takes minutes,
	// and another environment may hold the host for a while.
	if err := e.step(ctx, "building gpu-injector (cgo, for NVML)", e.build); err != nil {
		return nil, err
	}
	if err := e.step(ctx, "building the container image (make image: go run ./hack/image)", e.buildImage); err != nil {
		return nil, err
	}
	if err := e.step(ctx, "joining this machine's other environments: the device nodes for NVIDIA's device plugin, the mountpoint "+kubeletHome, e.joinHost); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	for _, s := range []struct {
		what string
		fn   func(context.Context) error
	}{
		{"installing the stand-in drivers: " + e.describeNodes(), e.installDrivers},
		{"starting the local cluster (etcd, kube-apiserver, scheduler, controller-manager, containerd, kubelet)", e.startCluster},
		{"starting NVIDIA's device plugin " + deviceplugin.Version + " as a DaemonSet pod (--pass-device-specs, the stand-in's NVML): " + fmt.Sprintf("%d x %s on %s", e.KubeletNode().GPUs, GPUResource, e.KubeletNode().Name), e.startDevicePlugin},
		{"registering the API-only GPU nodes", e.createAPINodes},
		{"pushing the image index and the packaged chart to the cluster's registry (remote.WriteIndex, helm package, helm push)", e.publish},
		{"helm install " + Release + " oci://<registry>/charts/gpu-injector --version " + ChartVersion + " -n " + Namespace + " --create-namespace (image values, probe on GPU nodes) --wait", e.installChart},
		{"starting the API-only nodes' probes (local processes, tokens bound to a pod on each node)", e.startProbes},
		{"waiting for every node's layout and for the webhook to see them", e.waitLayouts},
		{"building the driverless workload image", e.buildImages},
	} {
		if err := e.step(ctx, s.what, s.fn); err != nil {
			return nil, err
		}
	}
	e.progress("environment ready: kubeconfig %s, logs %s", e.Kubeconfig, e.LogsDir)
	return e, nil
}

func (e *Env) step(ctx context.Context, what string, fn func(context.Context) error) error {
	e.progress("%s", what)
	t := time.Now()
	if err := fn(ctx); err != nil {
		return err
	}
	e.progress("  done in %s", time.Since(t).Round(100*time.Millisecond))
	return nil
}

func (e *Env) progress(format string, args ...any) {
	fmt.Fprintf(e.out, "[env %6.1fs] %s\n", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...))
}

func (e *Env) describeNodes() string {
	var parts []string
	for _, n := range e.Nodes {
		kind := "API-only"
		if n.Kubelet {
			kind = "kubelet"
		}
		parts = append(parts, fmt.Sprintf("%s (%s, %s %s)", n.Name, kind, n.Layout, n.DriverVersion))
	}
	return strings.Join(parts, ", ")
}

// MarkFailed makes Down keep the folder when Options.KeepOnFailure is set.
func (e *Env) MarkFailed() {
	e.mu.Lock()
	e.failed = true
	e.mu.Unlock()
}

// Node returns the node of that name, nil if there is none.
func (e *Env) Node(name string) *Node {
	for _, n := range e.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// KubeletNode is the node a real kubelet runs: pods bound there run.
func (e *Env) KubeletNode() *Node { return e.Nodes[0] }

// RESTConfig returns a fresh admin client configuration.
func (e *Env) RESTConfig() *rest.Config { return e.Cluster.RESTConfig() }

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if mod := strings.TrimSpace(string(out)); mod != "" && mod != os.DevNull && isRepo(filepath.Dir(mod)) {
			return filepath.Dir(mod), nil
		}
	}
	// Outside the checkout (a demo started from elsewhere): this source file's own repository.
	if _, file, _, ok := runtime.Caller(0); ok {
		if dir := filepath.Join(filepath.Dir(file), "..", ".."); isRepo(dir) {
			return filepath.Abs(dir)
		}
	}
	return "", errors.New("failed to find the gpu-injector repository: run from inside the checkout")
}

func isRepo(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && strings.Contains(string(data), "module github.com/gpu-injector/gpu-injector\n")
}

func (e *Env) build(ctx context.Context) error {
	e.Binary = filepath.Join(e.Dir, "bin", "gpu-injector")
	// -trimpath as hack/image builds, so the image's build reuses these
	// compiled packages and only links again.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", e.Binary, ".")
	cmd.Dir = e.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("failed to build gpu-injector: %w\n%s", err, out)
	}
	return nil
}

// joinHost makes the device nodes NVIDIA's device plugin hands GPU
// containers (a container that opens one gets ENXIO: no driver answers) and
// the mountpoint of the kubelet node's driver folder, where this machine
// lacks them.
func (e *Env) joinHost(ctx context.Context) error {
	host, err := joinHost(ctx, func() ([]string, error) {
		made, err := makeMountpoint(kubeletHome)
		if err != nil {
			return made, err
		}
		nodes, err := deviceplugin.CreateDeviceNodes("/", e.KubeletNode().GPUs)
		return append(made, nodes...), err
	})
	e.host = host
	return err
}

func (e *Env) installDrivers(context.Context) error {
	for _, n := range e.Nodes {
		n.stage = filepath.Join(e.Dir, "roots", n.Name)
		if !n.Kubelet {
			n.HostRoot = n.stage
		}
		v := n.DriverVersion
		n.DriverVersion = ""
		if err := e.installDriver(n, v); err != nil {
			return err
		}
	}
	return nil
}

func (e *Env) startCluster(ctx context.Context) error {
	kn := e.KubeletNode()
	auditFlags, err := e.auditFlags()
	if err != nil {
		return err
	}
	c, err := cluster.Start(ctx, cluster.Options{
		APIServerFlags: auditFlags,
		Runtime:        e.opts.Runtime,
		NodeName:       kn.Name,
		NodeBinds:      map[string]string{kubeletHome: filepath.Join(kn.stage, kubeletHome)},
		NodeLabels: map[string]string{
			LabelAccelerator: kn.Accelerator,
			LabelGPUPresent:  "true",
		},
		LogsDir: filepath.Join(e.LogsDir, "cluster"),
		// The chart and its image come from here, as from a private registry.
		Registry: true,
		// The API-only nodes never heartbeat: without this the node lifecycle
		// controller marks them unreachable and taints them.
		ControllerManagerFlags: []string{"--controllers=*,-node-lifecycle-controller"},
		Logger:                 e.opts.Logger,
	})
	if err != nil {
		return err
	}
	e.Cluster = c
	e.Clientset = c.Clientset
	// Every new Node gets the not-ready taint (TaintNodesByCondition), and the
	// node lifecycle controller, turned off above, is what lifts it once the
	// node is Ready (cluster.Start waited for that).
	if err := untaintNotReady(ctx, c.Clientset, kn.Name); err != nil {
		return err
	}
	e.Kubeconfig = c.Kubeconfig
	e.Kubectl = c.Binaries.Kubectl
	e.Helm = filepath.Join(filepath.Dir(filepath.Dir(c.Binaries.Kubectl)), "helm-"+cluster.HelmVersion, "helm")
	if e.Applier, err = NewApplier(c.RESTConfig()); err != nil {
		return err
	}
	return nil
}

// startDevicePlugin runs NVIDIA's device plugin on the kubelet node as a
// cluster without NVIDIA's container toolkit runs it (deviceplugin's
// manifest): it reads the stand-in's NVML through the node's driver folder and
// hands each GPU container the device nodes, which this machine lacks until
// they are made here.
func (e *Env) startDevicePlugin(ctx context.Context) error {
	kn := e.KubeletNode()
	bin, err := deviceplugin.Binary(e.Cluster.CacheDir)
	if err != nil {
		return err
	}
	files, err := deviceplugin.ImageFiles(bin)
	if err != nil {
		return err
	}
	tar, err := e.Cluster.BuildImageWithConfig(deviceplugin.Image, files, cluster.ImageConfig{Env: deviceplugin.ImageEnv})
	if err != nil {
		return err
	}
	if err := e.Cluster.ImportImage(ctx, tar); err != nil {
		return err
	}
	m, err := deviceplugin.Manifest(deviceplugin.Image, hostDriverDir)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(m, &obj.Object); err != nil {
		return fmt.Errorf("failed to decode the device plugin's manifest: %w", err)
	}
	if err := e.Applier.Apply(ctx, obj, false); err != nil {
		return err
	}
	return e.poll(ctx, fmt.Sprintf("%s allocatable %s=%d from NVIDIA's device plugin", kn.Name, GPUResource, kn.GPUs), func(ctx context.Context) (bool, error) {
		node, err := e.Clientset.CoreV1().Nodes().Get(ctx, kn.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := node.Status.Allocatable[GPUResource]
		return q.Value() == int64(kn.GPUs), nil
	})
}

func (e *Env) createAPINodes(ctx context.Context) error {
	for _, n := range e.Nodes {
		if n.Kubelet {
			continue
		}
		if err := createAPINode(ctx, e.Clientset, n); err != nil {
			return err
		}
	}
	return nil
}

// TokenKubeconfig writes a kubeconfig that authenticates with a fresh token
// of a service account, bound to pod when pod is set.
func (e *Env) TokenKubeconfig(ctx context.Context, sa string, pod *corev1.Pod, file string) error {
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(24 * 3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := e.Clientset.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("failed to request a token for %s/%s: %w", Namespace, sa, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: e.Cluster.APIServerURL, CertificateAuthority: e.Cluster.CAFile}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa, Namespace: Namespace}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, file); err != nil {
		return fmt.Errorf("failed to write kubeconfig %s: %w", file, err)
	}
	return os.Chmod(file, 0o600)
}

func (e *Env) startProbes(ctx context.Context) error {
	for _, n := range e.Nodes {
		if n.Kubelet {
			// The chart's DaemonSet pod, which helm install waited for.
			n.restarts = e.probeRestarts
			continue
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "nodeprobe-token-" + n.Name, Namespace: Namespace,
				Labels: map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "nodeprobe"},
				Annotations: map[string]string{"gpu-injector.io/e2e": "holds the node-bound token of the probe that runs as a local process; " +
					"on an API-only node it stays Pending, which is enough for the token"}},
			Spec: corev1.PodSpec{
				NodeName:                     n.Name,
				ServiceAccountName:           e.ProbeSA,
				AutomountServiceAccountToken: ptr(false),
				Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{
					Name: "pause", Image: cluster.PauseImage, ImagePullPolicy: corev1.PullNever,
					SecurityContext: &corev1.SecurityContext{
						RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(65532)), AllowPrivilegeEscalation: ptr(false),
						ReadOnlyRootFilesystem: ptr(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
				}},
			},
		}
		created, err := e.Clientset.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("failed to create the token pod of %s: %w", n.Name, err)
		}
		n.probeKubeconfig = filepath.Join(e.Dir, "nodeprobe-"+n.Name+".kubeconfig")
		if err := e.TokenKubeconfig(ctx, e.ProbeSA, created, n.probeKubeconfig); err != nil {
			return err
		}
		n.ProbeLog = filepath.Join(e.LogsDir, "nodeprobe-"+n.Name+".log")
		n.restarts = nil
		n.probe = newProc("nodeprobe-"+n.Name, e.Binary, n.ProbeLog, true,
			"nodeprobe",
			"--node-name="+n.Name,
			"--host-root="+n.HostRoot,
			"--config="+e.ConfigFile,
			"--kubeconfig="+n.probeKubeconfig,
			"--health-probe-bind-address=0",
			"--metrics-bind-address=0",
		)
		if err := n.probe.start(); err != nil {
			return err
		}
	}
	return nil
}

// StopLocalProbes stops the probes the environment runs as local processes
// for the API-only nodes: in a real cluster those are pods of the chart's
// DaemonSet, which helm uninstall's hook deletes, and nothing else may
// write to the Nodes once it has.
func (e *Env) StopLocalProbes() error {
	var errs []error
	for _, n := range e.Nodes {
		if n.probe != nil {
			errs = append(errs, n.probe.stop(10*time.Second))
		}
	}
	return errors.Join(errs...)
}

// Fingerprints are the layout fingerprints the nodes publish now, by node.
type Fingerprints map[string]string

func (e *Env) waitLayouts(ctx context.Context) error {
	fps, err := e.WaitProbed(ctx)
	if err != nil {
		return err
	}
	for _, n := range e.Nodes {
		e.progress("  %s: %s driver %s, fingerprint %s", n.Name, n.Layout, n.DriverVersion, fps[n.Name])
	}
	return e.WaitWebhookSees(ctx, fps)
}

// WaitProbed waits until every node carries state=ready and the fingerprint
// of its current stand-in driver version, and returns the fingerprints.
func (e *Env) WaitProbed(ctx context.Context) (Fingerprints, error) {
	fps := Fingerprints{}
	var last string
	err := e.poll(ctx, "every node probed", func(ctx context.Context) (bool, error) {
		for _, n := range e.Nodes {
			if n.probe != nil {
				if gone, err := n.probe.exited(); gone {
					return false, withLog(err, n.probe)
				}
			}
			node, err := e.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			l := node.Labels
			if l[layout.LabelState] != layout.StateReady || l[layout.LabelDriverVersion] != n.DriverVersion || l[layout.LabelFingerprint] == "" {
				last = fmt.Sprintf("node %s: state %q driver %q (want %s), reason %q", n.Name, l[layout.LabelState],
					l[layout.LabelDriverVersion], n.DriverVersion, node.Annotations[layout.AnnotationStateReason])
				return false, nil
			}
			fps[n.Name] = l[layout.LabelFingerprint]
		}
		return true, nil
	})
	if err != nil {
		var logs []string
		for _, n := range e.Nodes {
			if n.probe != nil {
				logs = append(logs, fmt.Sprintf("--- %s ---\n%s", n.ProbeLog, n.probe.tail(10)))
			}
		}
		logs = append(logs, e.podsReport(context.Background()))
		return nil, fmt.Errorf("%w (last: %s)\n%s", err, last, strings.Join(logs, "\n"))
	}
	return fps, nil
}

// WaitWebhookSees waits until the node index of every ready webhook replica
// holds each of these layouts (its gpu_injector_layout_nodes metric), so the
// next pod gets them whichever replica the API server calls.
func (e *Env) WaitWebhookSees(ctx context.Context, fps Fingerprints) error {
	want := map[string]bool{}
	for _, fp := range fps {
		want[fp] = true
	}
	var body string
	err := e.poll(ctx, "the webhook to see every layout", func(ctx context.Context) (bool, error) {
		urls, err := e.WebhookMetricsURLs(ctx)
		if err != nil || len(urls) == 0 {
			return false, nil
		}
		for _, u := range urls {
			b, err := httpGet(ctx, u)
			if err != nil {
				return false, nil
			}
			body = b
			for fp := range want {
				if !strings.Contains(body, `gpu_injector_layout_nodes{fingerprint="`+fp+`"}`) {
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		var lines []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "gpu_injector_layout") {
				lines = append(lines, l)
			}
		}
		return fmt.Errorf("%w; webhook metrics: %s\n%s", err, strings.Join(lines, "; "), e.podsReport(context.Background()))
	}
	return nil
}

// UpgradeDriver installs another stand-in version on a node (the new files,
// the SONAME links repointed, the old version removed, as a driver package
// upgrade does), sends SIGHUP to its probe, and waits until the node
// publishes the new layout and the webhook sees it. It returns the new
// fingerprint. The probe, which cannot load a second NVML library into one
// process, exits and is started again, as the kubelet would restart it.
func (e *Env) UpgradeDriver(ctx context.Context, name, version string) (string, error) {
	n := e.Node(name)
	if n == nil {
		return "", fmt.Errorf("failed to upgrade: no node %q", name)
	}
	e.progress("upgrading the stand-in driver of %s from %s to %s", n.Name, n.DriverVersion, version)
	if err := e.installDriver(n, version); err != nil {
		return "", err
	}
	if err := e.ProbeNow(ctx, n.Name); err != nil {
		return "", err
	}
	fps, err := e.WaitProbed(ctx)
	if err != nil {
		return "", err
	}
	if err := e.WaitWebhookSees(ctx, Fingerprints{n.Name: fps[n.Name]}); err != nil {
		return "", err
	}
	return fps[n.Name], nil
}

// RemoveDriver deletes a node's stand-in driver (on the kubelet node, its
// driver folder too) and tells its probe nothing: the node is as one
// whose driver has not arrived yet. InstallDriver puts one back.
func (e *Env) RemoveDriver(name string) error {
	n := e.Node(name)
	if n == nil || n.DriverVersion == "" {
		return fmt.Errorf("failed to remove the stand-in driver: no node %q with a driver", name)
	}
	e.progress("removing the stand-in driver %s of %s", n.DriverVersion, n.Name)
	if err := standin.Remove(n.stage, n.Layout, n.DriverVersion); err != nil {
		return err
	}
	n.DriverVersion = ""
	if !n.Kubelet {
		return nil
	}
	// The node sees no driver folder, as before the installer ran: the
	// folder goes, and its parent if nothing else is there.
	dir := filepath.Join(n.stage, hostDriverDir)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("failed to remove %s: %w", dir, err)
	}
	_ = os.Remove(filepath.Dir(dir))
	return nil
}

// InstallDriver installs a node's stand-in driver of version, as a driver
// installer does while the node's probe runs, and tells the probe nothing.
func (e *Env) InstallDriver(name, version string) error {
	n := e.Node(name)
	if n == nil {
		return fmt.Errorf("failed to install the stand-in driver: no node %q", name)
	}
	e.progress("installing the stand-in driver %s on %s", version, n.Name)
	return e.installDriver(n, version)
}

// ProbeNow sends SIGHUP to a node's probe, which probes at once.
func (e *Env) ProbeNow(ctx context.Context, name string) error {
	n := e.Node(name)
	if n == nil {
		return fmt.Errorf("failed to signal the probe: no node %q", name)
	}
	if n.probe != nil {
		return n.probe.signal(syscall.SIGHUP)
	}
	// The DaemonSet's pod: the signal reaches its process through
	// containerd; the kubelet restarts the container when it exits.
	p, err := e.ProbePod(ctx)
	if err != nil {
		return err
	}
	return e.SignalContainer(ctx, p, "nodeprobe", "SIGHUP")
}

// SetNVMLFault turns a fault of a node's stand-in NVML on or off
// (standin.SetFault): a file beside its libnvidia-ml, which the node's probe
// sees through its host root. It does not signal the probe.
func (e *Env) SetNVMLFault(name string, f standin.Fault, on bool) error {
	n := e.Node(name)
	if n == nil {
		return fmt.Errorf("failed to set a fault: no node %q", name)
	}
	e.progress("stand-in NVML of %s: %s %s", n.Name, f, map[bool]string{true: "on", false: "off"}[on])
	return standin.SetFault(n.DriverRoot(), n.Layout, n.DriverVersion, f, on)
}

// WaitWebhookMetric waits until the metrics of every ready webhook replica
// hold the line want (a sample, e.g. "gpu_injector_wedged_nodes 1"), so that
// the next pod sees that state whichever replica the API server calls.
func (e *Env) WaitWebhookMetric(ctx context.Context, want string) error {
	var body string
	err := e.poll(ctx, "the webhook's "+want, func(ctx context.Context) (bool, error) {
		urls, err := e.WebhookMetricsURLs(ctx)
		if err != nil || len(urls) == 0 {
			return false, nil
		}
		for _, u := range urls {
			if body, err = httpGet(ctx, u); err != nil || !slices.Contains(strings.Split(body, "\n"), want) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		var lines []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "gpu_injector_") && !strings.HasPrefix(l, "gpu_injector_build") {
				lines = append(lines, l)
			}
		}
		return fmt.Errorf("%w; webhook metrics: %s", err, strings.Join(lines, "; "))
	}
	return nil
}

func (e *Env) buildImages(ctx context.Context) error {
	files, err := workloads.Build(filepath.Join(e.Dir, "workloads"))
	if err != nil {
		return err
	}
	m := map[string]string{}
	for _, f := range files {
		m[f.Dest] = f.Source
		e.ImageFiles = append(e.ImageFiles, f.Dest)
	}
	sort.Strings(e.ImageFiles)
	if bad := DriverFiles(e.ImageFiles); len(bad) > 0 {
		return fmt.Errorf("the workload image must hold no driver file, but has %v", bad)
	}
	tar, err := e.Cluster.BuildImageWithConfig(WorkloadImage, m, cluster.ImageConfig{
		// The classic CUDA images' PATH, which names the injected driver folder.
		Env: []string{"PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	})
	if err != nil {
		return err
	}
	return e.Cluster.ImportImage(ctx, tar)
}

// DriverFiles returns the paths that name an NVIDIA driver file.
func DriverFiles(paths []string) []string {
	var bad []string
	for _, p := range paths {
		base := path.Base(p)
		for _, pat := range []string{"libcuda.so*", "libnvidia-*", "nvidia-smi*", "libnvcuvid*"} {
			if ok, _ := path.Match(pat, base); ok {
				bad = append(bad, p)
				break
			}
		}
	}
	return bad
}

// Down stops everything Up started, by PID, newest first, removes the
// host's stand-in driver and the environment's folder (kept after a failure
// with Options.KeepOnFailure). Safe to call more than once.
func (e *Env) Down() error {
	// A second caller (a signal handler during the first) waits for the first.
	e.downOnce.Do(func() { e.downErr = e.down() })
	return e.downErr
}

func (e *Env) down() error {
	e.mu.Lock()
	keep := e.failed && e.opts.KeepOnFailure
	e.mu.Unlock()
	e.progress("stopping the environment")
	var errs []error
	for _, n := range e.Nodes {
		if n.probe != nil {
			errs = append(errs, n.probe.stop(10*time.Second))
		}
	}
	errs = append(errs, e.savePodLogs())
	if e.Cluster != nil {
		// Keep the cluster's logs with ours: they live under LogsDir.
		errs = append(errs, e.Cluster.Stop())
	}
	errs = append(errs, e.host.leave())
	if keep {
		e.progress("kept %s", e.Dir)
	} else if e.Dir != "" {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove %s: %w", e.Dir, err))
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		e.progress("stopped, with errors: %v", err)
	} else {
		e.progress("stopped")
	}
	return err
}

// poll runs cond every 250ms until it holds, it fails, or ctx ends.
func (e *Env) poll(ctx context.Context, what string, cond func(context.Context) (bool, error)) error {
	if err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, cond); err != nil {
		return fmt.Errorf("failed waiting for %s: %w", what, err)
	}
	return nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

func httpOK(ctx context.Context, url string) bool {
	_, err := httpGet(ctx, url)
	return err == nil
}
