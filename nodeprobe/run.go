// Package nodeprobe is the per-node agent: it finds the node's NVIDIA driver
// through NVML and the host's files, plans the read-only mounts that give a
// container that driver, and publishes the plan on its own Node in the layout
// contract (package layout). docs/nodeprobe.md is its reference page.
package nodeprobe

import (
	"context"
	"encoding/json"
	"errors"
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
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
)

// retryInterval is the wait after a failed publish.
const retryInterval = 30 * time.Second

// ErrNotReady is wrapped by Once when no usable layout was found.
var ErrNotReady = errors.New("no usable driver layout")

// Options are what the agent needs besides the probe's own options.
type Options struct {
	// NodeName is the Node the agent publishes on.
	NodeName string
	// Interval is the time between probes; SIGHUP probes at once.
	Interval time.Duration
	// HealthAddr serves /healthz and /readyz, MetricsAddr /metrics; "0"
	// disables either.
	HealthAddr  string
	MetricsAddr string
	// StateDir is the folder shared with the NRI plugin (package
	// layout/statedir); empty is off.
	StateDir string
	// HostMountTable is the host's mount table, relative to the host's root
	// (DefaultHostMountTable when empty), which the probe compares with its
	// own copy of the host's driver mounts every MountPoll (10 s when 0).
	HostMountTable string
	MountPoll      time.Duration
	// Probe are the options of every probe.
	Probe ProbeOptions
	// Client writes the Node.
	Client kubernetes.Interface
	Log    logr.Logger
}

// Run is the agent (`gpu-injector nodeprobe`): it probes every Interval and
// publishes the result on the Node until ctx ends.
func Run(ctx context.Context, o Options) error {
	return (&daemon{opts: &o, probe: o.Probe, client: o.Client, log: o.Log, metrics: newMetrics()}).run(ctx)
}

// Once probes once with o.Probe and writes to stdout, as a Node in format
// (yaml or json), what the agent would publish on o.NodeName (the hostname
// when empty) (`gpu-injector nodeprobe --once`). It wraps ErrNotReady when
// no usable layout was found; it needs no Client.
func Once(o Options, format string, stdout io.Writer) error {
	name := o.NodeName
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("failed to read the hostname: %w", err)
		}
		name = h
	}
	res, err := Probe(o.Probe)
	if err != nil {
		return err
	}
	logResult(o.Log, res, 0)
	pub, err := Desired(res)
	if err != nil {
		return err
	}
	node := NodeObject{APIVersion: "v1", Kind: "Node", Metadata: NodeMeta{Name: name, Labels: pub.Labels, Annotations: pub.Annotations}}
	if pub.Wedged.Status == corev1.ConditionTrue {
		node.Status = &NodeObjectStatus{Conditions: []NodeObjectCondition{{Type: NodeConditionDriverWedged, Status: pub.Wedged.Status, Reason: pub.Wedged.Reason, Message: pub.Wedged.Message}}}
	}
	var out []byte
	switch format {
	case "json":
		out, err = json.MarshalIndent(node, "", "  ")
		out = append(out, '\n')
	case "layout":
		// What a declared pool (config.pinning.pools) takes as its layout.
		text, ok := pub.Annotations[layout.AnnotationLayout]
		if !ok {
			return fmt.Errorf("%w: %s", ErrNotReady, res.Reason())
		}
		out = []byte(text + "\n")
	default:
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
	opts    *Options
	probe   ProbeOptions
	client  kubernetes.Interface
	log     logr.Logger
	metrics *metrics
	ready   atomic.Bool
	// clock is the liveness check's; nil means the real one.
	clock clock.PassiveClock
	// started and lastProbe are UnixNano times for /healthz; 0 means never.
	started, lastProbe atomic.Int64

	// nvmlPath is the library loaded into this process. go-nvml binds the C
	// symbols once per process, so a different file (a driver upgrade) can
	// only be read by a new process: the probe exits and the kubelet restarts it.
	nvmlMu   sync.Mutex
	nvmlPath string

	// wake probes at once: a stuck NVML reading returned (NVMLWatch.Returned).
	wake chan struct{}
	// driverChanged probes at once: the driver's folders changed (driverWatch).
	driverChanged chan struct{}

	// pluginUp is what the NRI plugin's file said last (statedir); relabel
	// asks the loop to republish when that changes; lastPub is the last
	// probe's publication, which a relabel writes again. pluginPoll is the
	// file's poll interval; 0 means pluginPoll.
	pluginUp   atomic.Bool
	relabel    chan struct{}
	lastPub    *Published
	pluginPoll time.Duration
	// mountsPropagate: the container's copy of the host's driver mounts
	// follows the host's (watchMounts).
	mountsPropagate atomic.Bool
	// staleDriver is the plugin's stale driver record as the Node's
	// annotation value; "" when it has none (staledriver.go).
	staleDriver atomic.Value
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

// run serves the health and metrics endpoints, starts the watches and
// probes until ctx ends.
func (d *daemon) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.setDefaults()
	errc := make(chan error, 3)
	if err := nodeagent.Serve(ctx, d.opts.HealthAddr, d.healthMux(), errc); err != nil {
		return err
	}
	if err := nodeagent.Serve(ctx, d.opts.MetricsAddr, promHandler(d.metrics), errc); err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	d.started.Store(d.now().UnixNano())
	log := d.log.WithValues("node", d.opts.NodeName)
	log.Info("node probe started", "hostRoot", d.probe.HostRoot, "interval", d.opts.Interval.String(), "nvmlTimeout", d.probe.NVMLWatch.timeout().String(), "stateDir", d.opts.StateDir)
	if d.opts.StateDir != "" {
		d.pluginUp.Store(d.pluginRegistered(log))
		go d.watchPlugin(ctx, log)
	}
	go d.watchDriver(ctx, log)
	go d.watchMounts(ctx, log, errc)
	return d.loop(ctx, log, errc, hup)
}

// setDefaults fills what a test may set and the daemon needs: the NVML
// opener and watch, and the channels that ask for a probe.
func (d *daemon) setDefaults() {
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
		d.probe.NVMLWatch = &NVMLWatch{}
	}
	// The driver answering again is news the node should carry at once,
	// not at the next interval.
	d.probe.NVMLWatch.Returned = d.wakeUp
	if d.driverChanged == nil {
		d.driverChanged = make(chan struct{}, 1)
	}
}

// loop probes and publishes at each interval and whenever asked, until ctx
// ends or a server or watch fails (errc).
func (d *daemon) loop(ctx context.Context, log logr.Logger, errc <-chan error, hup <-chan os.Signal) error {
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
		case <-d.driverChanged:
			log.Info("the driver's folders changed: probing now")
		case <-d.relabel:
			if err := d.republish(ctx, log); err != nil && !errors.Is(err, ErrConditionForbidden) {
				log.Error(err, "failed to publish the nri plugin label; the next probe tries again")
			}
			continue
		case <-timer.C:
		}
		next := d.opts.Interval
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

// watchDriver asks the loop for a probe whenever the driver's folders change
// (driverWatch), so that a driver installed or upgraded after the start is
// published within seconds; the interval's probe stays the backstop.
func (d *daemon) watchDriver(ctx context.Context, log logr.Logger) {
	root := d.probe.HostRoot
	if root == "" {
		root = "/"
	}
	dw := newDriverWatch(root, log, func() {
		select {
		case d.driverChanged <- struct{}{}:
		default:
		}
	})
	if err := dw.run(ctx); err != nil {
		log.Error(err, "failed to watch the driver's folders; a driver installed later is found by the next periodic probe or a SIGHUP")
	}
}

// once probes and publishes. Readiness means the node carries the result of a
// finished probe, ready or error state alike: the agent did its job.
func (d *daemon) once(ctx context.Context, log logr.Logger) error {
	// Finished, whatever the outcome: only a probe that never returns is a hang.
	defer func() { d.lastProbe.Store(d.now().UnixNano()) }()
	start := d.now()
	res, err := Probe(d.probe)
	d.metrics.duration.Observe(d.now().Sub(start).Seconds())
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
	pub = d.withMounts(d.withPlugin(pub))
	wrote, err := Publish(ctx, d.client, d.opts.NodeName, pub)
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

func (d *daemon) now() time.Time { return wallclock.Or(d.clock).Now() }

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
	timeout := DefaultNVMLTimeout
	if d.probe.NVMLWatch != nil {
		timeout = d.probe.NVMLWatch.timeout()
	}
	age, limit = d.now().Sub(time.Unix(0, since)), hangLimit(d.opts.Interval, timeout)
	return age, limit, age > limit
}
