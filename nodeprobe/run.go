// Package nodeprobe is the per-node agent: it finds the node's NVIDIA driver
// through NVML and the host's files, plans the read-only mounts that give a
// container that driver, and publishes the plan on its own Node in the layout
// contract (package layout). docs/nodeprobe.md is its reference page.
package nodeprobe

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
)

// retryInterval is the wait after a failed publish.
const retryInterval = 30 * time.Second

// ErrUsage marks a bad command line; the caller should exit with status 2.
var ErrUsage = errors.New("usage error")

// ErrNotReady is wrapped by --once when no usable layout was found.
var ErrNotReady = errors.New("no usable driver layout")

type options struct {
	once        bool
	hostRoot    string
	output      string
	configFile  string
	nodeName    string
	interval    time.Duration
	kubeconfig  string
	nvmlLibrary string
	healthAddr  string
	metricsAddr string
	verbosity   int
	ignoreRI    bool
	nvmlTimeout time.Duration
	stateDir    string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("nodeprobe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&o.once, "once", false, "probe once, print what would be published on the Node, and exit; non-zero when no usable layout was found")
	fs.StringVar(&o.hostRoot, "host-root", "/host", "folder where the host's / is mounted (read-only)")
	fs.StringVar(&o.output, "o", "yaml", "output format of --once: yaml or json")
	fs.StringVar(&o.configFile, "config", "", "configuration file (InjectorConfiguration); empty means defaults")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME; --once falls back to the hostname)")
	fs.DurationVar(&o.interval, "interval", 5*time.Minute, "time between probes; SIGHUP probes at once")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, in-cluster, then ~/.kube/config")
	fs.StringVar(&o.nvmlLibrary, "nvml-library", "", "libnvidia-ml file to load (a path on this machine); empty means the host's libnvidia-ml.so.1 under --host-root")
	fs.StringVar(&o.healthAddr, "health-probe-bind-address", ":8082", "address of /healthz and /readyz; 0 disables")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8083", "address of /metrics; 0 disables")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity; 1 logs every probe's notes")
	fs.DurationVar(&o.nvmlTimeout, "nvml-timeout", DefaultNVMLTimeout, "longest wait for NVML (nvmlInit to nvmlShutdown) before the node is marked wedged")
	fs.StringVar(&o.stateDir, "state-dir", "", "folder shared with the NRI plugin: the probe writes layout.json there after every probe, and publishes the "+layout.LabelNRIPlugin+" label while the plugin's nri-plugin.json there says it is registered; empty is off")
	fs.BoolVar(&o.ignoreRI, "ignore-runtime-injection", false, "plan mounts even where the container runtime or the device plugin injects the driver itself (NVIDIA toolkit as the default runtime, CDI specs, GKE's device plugin)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	if o.output != "yaml" && o.output != "json" {
		return nil, fmt.Errorf("%w: -o must be yaml or json, not %q", ErrUsage, o.output)
	}
	if o.interval <= 0 {
		return nil, fmt.Errorf("%w: --interval must be positive", ErrUsage)
	}
	if o.nvmlTimeout <= 0 {
		return nil, fmt.Errorf("%w: --nvml-timeout must be positive", ErrUsage)
	}
	if !o.once && o.nodeName == "" {
		return nil, fmt.Errorf("%w: --node-name or $NODE_NAME is required without --once", ErrUsage)
	}
	return o, nil
}

// Run is the nodeprobe subcommand.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := nodeagent.NewLogger(stderr, o.verbosity)
	nodeagent.SetMemoryLimit(log)
	cfg, err := config.Load(o.configFile)
	if err != nil {
		return err
	}
	popts := ProbeOptions{HostRoot: o.hostRoot, NVMLLibrary: o.nvmlLibrary, Config: cfg, IgnoreRuntimeInjection: o.ignoreRI,
		NVMLWatch: &NVMLWatch{Timeout: o.nvmlTimeout}}
	if o.once {
		return runOnce(o, popts, log, stdout)
	}
	restCfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("failed to create a Kubernetes client: %w", err)
	}
	return (&daemon{opts: o, probe: popts, client: client, log: log, metrics: newMetrics()}).run(ctx)
}

func runOnce(o *options, popts ProbeOptions, log logr.Logger, stdout io.Writer) error {
	name := o.nodeName
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("failed to read the hostname: %w", err)
		}
		name = h
	}
	res, err := Probe(popts)
	if err != nil {
		return err
	}
	logResult(log, res, 0)
	pub, err := Desired(res)
	if err != nil {
		return err
	}
	node := NodeObject{APIVersion: "v1", Kind: "Node", Metadata: NodeMeta{Name: name, Labels: pub.Labels, Annotations: pub.Annotations}}
	if pub.Wedged.Status == corev1.ConditionTrue {
		node.Status = &NodeObjectStatus{Conditions: []NodeObjectCondition{{Type: NodeConditionDriverWedged, Status: pub.Wedged.Status, Reason: pub.Wedged.Reason, Message: pub.Wedged.Message}}}
	}
	var out []byte
	if o.output == "json" {
		out, err = json.MarshalIndent(node, "", "  ")
		out = append(out, '\n')
	} else {
		out, err = yaml.Marshal(node)
	}
	if err != nil {
		return fmt.Errorf("failed to encode node: %w", err)
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("failed to write output: %w", err)
	}
	if !res.Ready() {
		return fmt.Errorf("%w: %s", ErrNotReady, res.Reason())
	}
	return nil
}

func logResult(log logr.Logger, res Result, v int) {
	kv := []any{"condition", res.Condition, "driverVersion", res.DriverVersion, "versionSource", res.VersionSource,
		"nvmlState", res.NVML.State, "nvmlLibrary", res.NVMLLibrary}
	switch {
	case res.Ready():
		kv = append(kv, "fingerprint", res.Plan.Fingerprint(), "mounts", len(res.Plan.Mounts), "runtimeInjection", res.Plan.RuntimeInjection)
		log.V(v).Info("probe found a driver layout", kv...)
	case res.Condition == ConditionNoDriver:
		// Every probe of a CPU node says the same: log it once per start.
		log.V(v).Info("probe found no NVIDIA driver or device", kv...)
	case res.Wedged():
		log.Info("probe found the NVIDIA driver wedged", append(kv, "reason", res.Reason())...)
	default:
		log.Info("probe found no usable driver layout", append(kv, "reason", res.Reason())...)
	}
	if len(res.Notes) > 0 || len(res.Evidence) > 0 {
		log.V(1).Info("probe notes", "notes", res.Notes, "evidence", res.Evidence)
	}
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("failed to load kubeconfig %q: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := ctrlconfig.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("failed to find a Kubernetes configuration: %w", err)
	}
	return c, nil
}

type metrics struct {
	registry *prometheus.Registry
	duration prometheus.Histogram
	errors   *prometheus.CounterVec
	writes   prometheus.Counter
	wedged   prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gpu_injector_probe_duration_seconds", Help: "Time of one probe: NVML, file discovery and plan.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_injector_probe_errors_total", Help: "Probes that found no usable layout, by condition.",
		}, []string{"state"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_injector_probe_node_writes_total", Help: "Patches of this node's labels and annotations, or of its GPUDriverWedged condition.",
		}),
		wedged: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_injector_probe_driver_wedged", Help: "1 while the last probe found the driver wedged (NVML hung or reports a GPU lost), else 0.",
		}),
	}
	m.registry.MustRegister(m.duration, m.errors, m.writes, m.wedged, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func promHandler(m *metrics) http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

type daemon struct {
	opts    *options
	probe   ProbeOptions
	client  kubernetes.Interface
	log     logr.Logger
	metrics *metrics
	ready   atomic.Bool
	// now is the clock of the liveness check; nil means time.Now.
	now func() time.Time
	// started and lastProbe are UnixNano times for /healthz; 0 means never.
	started, lastProbe atomic.Int64

	// nvmlPath is the library loaded into this process. go-nvml binds the C
	// symbols once per process, so a different file (a driver upgrade) can
	// only be read by a new process: the probe exits and the kubelet restarts it.
	nvmlMu   sync.Mutex
	nvmlPath string

	// wake probes at once: a stuck NVML reading returned (NVMLWatch.Returned).
	wake chan struct{}

	// pluginUp is what the NRI plugin's file said last (statedir); relabel
	// asks the loop to republish when that changes; lastPub is the last
	// probe's publication, which a relabel writes again. pluginPoll is the
	// file's poll interval; 0 means pluginPoll.
	pluginUp   atomic.Bool
	relabel    chan struct{}
	lastPub    *Published
	pluginPoll time.Duration
}

// wakeUp asks the loop for a probe now, without blocking: one pending
// request is as good as many.
func (d *daemon) wakeUp() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *daemon) openNVML(p string) (NVML, error) {
	d.nvmlMu.Lock()
	defer d.nvmlMu.Unlock()
	real, err := filepath.EvalSymlinks(p)
	if errors.Is(err, fs.ErrNotExist) {
		// Gone since discovery (a driver being upgraded): a state to publish,
		// not an error that would leave the old layout up.
		return nil, &nvmlUnusable{NVMLResult{State: NVMLLibraryNotFound, Message: err.Error()}}
	}
	if err != nil {
		return nil, fmt.Errorf("failed to resolve NVML library %q: %w", p, err)
	}
	if d.nvmlPath != "" && d.nvmlPath != real {
		return nil, fmt.Errorf("%w from %s to %s: restarting to load it", ErrNVMLReload, d.nvmlPath, real)
	}
	if c := CheckNVMLLibrary(p); c.State != NVMLOK {
		return nil, &nvmlUnusable{c}
	}
	d.nvmlPath = real
	return OpenNVML(p), nil
}

func (d *daemon) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if d.probe.OpenNVML == nil {
		d.probe.OpenNVML = d.openNVML
	}
	if d.wake == nil {
		d.wake = make(chan struct{}, 1)
	}
	if d.relabel == nil {
		d.relabel = make(chan struct{}, 1)
	}
	if d.probe.NVMLWatch == nil {
		d.probe.NVMLWatch = &NVMLWatch{Timeout: d.opts.nvmlTimeout}
	}
	// The driver answering again is news the node should carry at once,
	// not at the next interval.
	d.probe.NVMLWatch.Returned = d.wakeUp
	errc := make(chan error, 2)
	if err := nodeagent.Serve(ctx, d.opts.healthAddr, d.healthMux(), errc); err != nil {
		return err
	}
	if err := nodeagent.Serve(ctx, d.opts.metricsAddr, promHandler(d.metrics), errc); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	d.started.Store(d.clock().UnixNano())
	log := d.log.WithValues("node", d.opts.nodeName)
	log.Info("node probe started", "hostRoot", d.opts.hostRoot, "interval", d.opts.interval.String(), "nvmlTimeout", d.probe.NVMLWatch.timeout().String(), "stateDir", d.opts.stateDir)
	if d.opts.stateDir != "" {
		d.pluginUp.Store(d.pluginRegistered(log))
		go d.watchPlugin(ctx, log)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			d.dropPluginLabel(log)
			return nil
		case err := <-errc:
			return err
		case <-hup:
			log.Info("sighup: probing now")
		case <-d.wake:
			log.Info("a stuck NVML call returned: probing now")
		case <-d.relabel:
			if err := d.republish(ctx, log); err != nil && !errors.Is(err, ErrConditionForbidden) {
				log.Error(err, "failed to publish the nri plugin label; the next probe tries again")
			}
			continue
		case <-timer.C:
		}
		next := d.opts.interval
		if err := d.once(ctx, log); err != nil {
			if errors.Is(err, ErrNVMLReload) {
				return err
			}
			// An unreachable API server should not leave the node stale for a whole interval.
			next = min(next, retryInterval)
			log.Error(err, "failed to publish the probe result", "retryIn", next.String())
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// once probes and publishes. Readiness means the node carries the result of a
// finished probe, ready or error state alike: the agent did its job.
func (d *daemon) once(ctx context.Context, log logr.Logger) error {
	// Finished, whatever the outcome: only a probe that never returns is a hang.
	defer func() { d.lastProbe.Store(d.clock().UnixNano()) }()
	start := time.Now()
	res, err := Probe(d.probe)
	d.metrics.duration.Observe(time.Since(start).Seconds())
	d.writeState(log, &res, err)
	if err != nil {
		return err
	}
	if !res.Ready() && res.Condition != ConditionNoDriver {
		d.metrics.errors.WithLabelValues(string(res.Condition)).Inc()
	}
	if res.Wedged() {
		d.metrics.wedged.Set(1)
	} else {
		d.metrics.wedged.Set(0)
	}
	logResult(log, res, 1)
	pub, err := Desired(res)
	if err != nil {
		return err
	}
	d.lastPub = &pub
	pub = d.withPlugin(pub)
	wrote, err := Publish(ctx, d.client, d.opts.nodeName, pub)
	// Counted and said even when the condition after the labels failed.
	if wrote {
		d.metrics.writes.Inc()
		log.Info("published node layout", "state", pub.Labels[layout.LabelState], "fingerprint", pub.Labels[layout.LabelFingerprint])
	}
	if errors.Is(err, ErrConditionForbidden) {
		log.V(1).Info("node condition not written; the state label marks the node", "condition", NodeConditionDriverWedged, "error", err.Error())
		err = nil
	}
	if err != nil {
		return err
	}
	d.ready.Store(true)
	return nil
}

func (d *daemon) healthMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if age, limit, hung := d.hung(); hung {
			http.Error(w, fmt.Sprintf("no probe finished for %s (limit %s)", age.Round(time.Second), limit), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.ready.Load() {
			http.Error(w, "no probe published yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}

func (d *daemon) clock() time.Time {
	if d.now != nil {
		return d.now()
	}
	return time.Now()
}

// hangLimit is how long the agent may go without finishing a probe: three
// intervals, and never less than an interval plus the NVML limit plus two
// minutes, so a slow probe, a short interval or a wedged driver (a probe then
// takes the whole NVML limit) does not get a working agent restarted.
func hangLimit(interval, nvmlTimeout time.Duration) time.Duration {
	return max(3*interval, interval+nvmlTimeout+2*time.Minute)
}

// hung reports whether the started agent has finished no probe within
// hangLimit: a probe stuck in the API server would otherwise keep stale keys
// on the node with a healthy pod. The kubelet's liveness probe on /healthz
// then restarts the container. A wedged driver is not such a hang: NVMLWatch
// ends the probe after the NVML limit with the wedged state, which the node
// then carries whether or not the container restarts.
func (d *daemon) hung() (age, limit time.Duration, hung bool) {
	since := max(d.started.Load(), d.lastProbe.Load())
	if d.started.Load() == 0 || d.opts == nil {
		return 0, 0, false
	}
	timeout := d.opts.nvmlTimeout
	if timeout <= 0 {
		timeout = DefaultNVMLTimeout
	}
	age, limit = d.clock().Sub(time.Unix(0, since)), hangLimit(d.opts.interval, timeout)
	return age, limit, age > limit
}
