package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
	"github.com/gpu-injector/gpu-injector/nriplugin/stale"
)

// DefaultSocket is where containerd and CRI-O listen for NRI plugins.
const DefaultSocket = "/var/run/nri/nri.sock"

// Reconnection backoff: the runtime restarts in seconds, and a node whose
// runtime has NRI off should not fill the log.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
)

// Options are the plugin's process plumbing.
type Options struct {
	// Socket is the container runtime's NRI socket.
	Socket string
	// StateDir is the folder shared with the node probe (package
	// layout/statedir): the probe's plan is read there, the plugin's record
	// written while registered.
	StateDir string
	// PluginIndex is the plugin's index among the runtime's NRI plugins (two
	// digits): the order in which plugins see a container.
	PluginIndex string
	// HealthAddr serves /healthz and /readyz, MetricsAddr /metrics; "0"
	// disables either.
	HealthAddr  string
	MetricsAddr string
	// Rules are the host path rules a plan must pass.
	Rules layout.Rules
	// LDLibraryPath is the configuration's ldLibraryPath: how the plan's
	// library folders join a container's LD_LIBRARY_PATH.
	LDLibraryPath config.LDLibraryPath
	// ProcRoot is the host's /proc as the plugin sees it: where it reads the
	// maps of the node's GPU containers' processes for deleted driver
	// libraries. Empty: no such scan.
	ProcRoot string
	// StaleDriverInterval is how often that scan runs; zero means
	// DefaultStaleDriverInterval.
	StaleDriverInterval time.Duration
	Log                 logr.Logger
}

type metrics struct {
	registry   *prometheus.Registry
	containers *prometheus.CounterVec
	registered prometheus.Gauge
	// byResult are the counter's children, looked up once: CreateContainer
	// then costs one atomic add.
	byResult map[string]prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		containers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_injector_nri_containers_total",
			Help: "Containers the runtime created while the plugin was registered, by what the plugin did: injected, or why not.",
		}, []string{"result"}),
		registered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_injector_nri_registered", Help: "1 while the container runtime has the plugin registered, else 0.",
		}),
		byResult: map[string]prometheus.Counter{},
	}
	for _, r := range Results {
		m.byResult[r] = m.containers.WithLabelValues(r)
	}
	m.registry.MustRegister(m.containers, m.registered, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) count(result string) {
	if c, ok := m.byResult[result]; ok {
		c.Inc()
		return
	}
	m.containers.WithLabelValues(result).Inc()
}

// Run keeps the plugin registered with the container runtime until ctx ends
// (`gpu-injector nri-plugin`).
func Run(ctx context.Context, o Options) error {
	if err := os.MkdirAll(o.StateDir, 0o755); err != nil {
		return fmt.Errorf("failed to create the state folder %q: %w", o.StateDir, err)
	}
	m := newMetrics()
	rro, kernel := KernelHasRecursiveReadOnly()
	s := &server{opts: &o, log: o.Log, metrics: m,
		plugin: &Plugin{StateDir: o.StateDir, Rules: o.Rules, Log: o.Log, Count: m.count,
			LDLibraryPath: o.LDLibraryPath, RecursiveReadOnly: rro}}
	mountOptions := recursiveReadOnlyOptions
	if !rro {
		mountOptions = noSubmountOptions
	}
	if o.ProcRoot != "" {
		s.stale = &staleScanner{proc: stale.Proc{Root: o.ProcRoot}, log: o.Log.WithName("stale-driver"), gauges: newStaleGauges(m.registry)}
	}
	o.Log.Info("driver mounts read-only all the way down", "kernel", kernel, "recursiveReadOnly", rro, "mountOptions", mountOptions,
		"ldLibraryPath", o.LDLibraryPath)
	return s.run(ctx)
}

// server keeps the plugin connected to the runtime and says so.
type server struct {
	opts    *Options
	log     logr.Logger
	metrics *metrics
	plugin  *Plugin
	// stale scans the node's GPU containers for deleted driver libraries;
	// nil when off.
	stale *staleScanner
	// clock is the heartbeat's; nil means the real one.
	clock clock.PassiveClock

	registered atomic.Bool
	// mu orders the writes and the removal of the plugin file, which the
	// heartbeat, the runtime's calls and the connection's end all make.
	mu     sync.Mutex
	record *statedir.Plugin
}

func (s *server) now() time.Time { return wallclock.Or(s.clock).Now() }

func (s *server) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	if err := nodeagent.Serve(ctx, s.opts.HealthAddr, s.healthMux(), errc); err != nil {
		return err
	}
	if err := s.registerSocketGauge(); err != nil {
		return fmt.Errorf("failed to register the socket gauge: %w", err)
	}
	if err := nodeagent.Serve(ctx, s.opts.MetricsAddr, promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}), errc); err != nil {
		return err
	}
	// A file left by a plugin that was killed must not keep the label up.
	s.unregister("starting")
	defer s.unregister("stopping")
	s.log.Info("nri plugin started", "socket", s.opts.Socket, "stateDir", s.opts.StateDir, "pluginName", layout.NRIPluginName, "pluginIndex", s.opts.PluginIndex)
	go s.heartbeat(ctx)
	if s.stale != nil {
		interval := s.opts.StaleDriverInterval
		if interval <= 0 {
			interval = DefaultStaleDriverInterval
		}
		s.log.Info("scanning gpu containers for deleted driver libraries", "procRoot", s.opts.ProcRoot, "interval", interval.String())
		go s.stale.loop(ctx, interval, s.setStaleDriver)
	}

	backoff := minBackoff
	lastErr := ""
	for {
		start := s.now()
		err := s.connectOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		select {
		case err := <-errc:
			return err
		default:
		}
		// A connection that lasted is a runtime that restarted: come back fast.
		if s.now().Sub(start) > maxBackoff {
			backoff = minBackoff
		}
		msg := "connection to the runtime closed"
		if err != nil {
			msg = err.Error()
		}
		// The same failure again (NRI off, socket absent) is said once.
		if msg != lastErr {
			s.log.Info("not connected to the container runtime's NRI; retrying", "socket", s.opts.Socket, "reason", msg, "retryIn", backoff.String())
			lastErr = msg
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// connectOnce registers with the runtime and serves it until the connection
// closes or ctx ends. A stub serves one connection, so each try makes one.
func (s *server) connectOnce(ctx context.Context) error {
	h := &handler{s: s}
	st, err := stub.New(h,
		stub.WithPluginName(layout.NRIPluginName),
		stub.WithPluginIdx(s.opts.PluginIndex),
		stub.WithSocketPath(s.opts.Socket),
		stub.WithLogger(nriLogger{s.log.WithName("nri")}),
		stub.WithOnClose(func() { s.unregister("the runtime closed the connection") }),
	)
	if err != nil {
		return fmt.Errorf("failed to create the NRI stub: %w", err)
	}
	err = st.Run(ctx)
	s.unregister("the connection ended")
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("failed to serve the runtime: %w", err)
	}
	return nil
}

// handler is what the stub calls; one per connection.
type handler struct {
	s                           *server
	runtimeName, runtimeVersion string
}

// Configure subscribes to container creation, the one event the plugin acts
// on, and, while it scans for deleted driver libraries, to the starts and
// removals that keep its list of GPU containers: events the runtime sends
// without waiting for an answer.
func (h *handler) Configure(_ context.Context, _, runtime, version string) (api.EventMask, error) {
	h.runtimeName, h.runtimeVersion = runtime, version
	if h.s.stale != nil {
		return api.MustParseEventMask("CreateContainer", "PostStartContainer", "RemoveContainer"), nil
	}
	return api.MustParseEventMask("CreateContainer"), nil
}

// Synchronize is the runtime's last step of registration: once this answer
// reaches it, it calls the plugin for every container it creates. The file
// is written just before that; the probe's poll and the webhook's watch of
// the label lag it by seconds.
func (h *handler) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	if st := h.s.stale; st != nil {
		byID := make(map[string]*api.PodSandbox, len(pods))
		for _, p := range pods {
			byID[p.GetId()] = p
		}
		for _, c := range ctrs {
			if p, ok := byID[c.GetPodSandboxId()]; ok {
				st.track(p, c)
			}
		}
	}
	h.s.register(h.runtimeName, h.runtimeVersion)
	if h.s.stale != nil {
		// The node's record at once, not an interval after a restart.
		go h.s.setStaleDriver(h.s.stale.scan())
	}
	return nil, nil
}

func (h *handler) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if h.s.stale != nil {
		h.s.stale.track(pod, ctr)
	}
	return nil
}

func (h *handler) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	if h.s.stale != nil {
		h.s.stale.forget(ctr.GetId())
	}
	return nil
}

func (h *handler) Shutdown(context.Context) {
	h.s.unregister("the runtime is shutting down")
}

func (h *handler) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return h.s.plugin.CreateContainer(ctx, pod, ctr)
}

func (s *server) register(runtime, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	s.record = &statedir.Plugin{Protocol: layout.NRIProtocol, RuntimeName: runtime, RuntimeVersion: version, RegisteredAt: now, Heartbeat: now}
	if err := statedir.WritePlugin(s.opts.StateDir, *s.record); err != nil {
		// Not fatal: the node keeps no label, so pods get hostPath volumes;
		// the heartbeat tries again.
		s.log.Error(err, "failed to tell the probe that the plugin is registered")
	}
	s.registered.Store(true)
	s.metrics.registered.Set(1)
	s.log.Info("registered with the container runtime", "runtime", runtime, "runtimeVersion", version)
}

func (s *server) unregister(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.record != nil
	s.record = nil
	s.registered.Store(false)
	s.metrics.registered.Set(0)
	if err := statedir.RemovePlugin(s.opts.StateDir); err != nil {
		s.log.Error(err, "failed to tell the probe that the plugin is not registered")
	}
	if was {
		s.log.Info("no longer registered with the container runtime", "reason", why)
	}
}

// setStaleDriver puts a scan's record into the plugin file, for the probe to
// publish on the Node; while not registered there is no file, and the record
// waits for the next scan.
func (s *server) setStaleDriver(rec layout.StaleDriver) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.record == nil {
		return
	}
	if old := s.record.StaleDriver; old != nil && sameStale(*old, rec) {
		return
	}
	s.record.StaleDriver = &rec
	if err := statedir.WritePlugin(s.opts.StateDir, *s.record); err != nil {
		s.log.Error(err, "failed to write the stale driver record")
	}
}

// sameStale compares two records but for when they were made: the probe
// republishes only what changed.
func sameStale(a, b layout.StaleDriver) bool {
	a.CheckedAt, b.CheckedAt = time.Time{}, time.Time{}
	return a.Containers == b.Containers && a.StaleContainers == b.StaleContainers && a.StalePods == b.StalePods &&
		a.Unreadable == b.Unreadable && slices.Equal(a.Pods, b.Pods)
}

// heartbeat refreshes the plugin file while registered, so the probe can
// tell a live plugin from a file left by one that was killed.
func (s *server) heartbeat(ctx context.Context) {
	t := time.NewTicker(statedir.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.beat()
		}
	}
}

func (s *server) beat() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.record == nil {
		return
	}
	s.record.Heartbeat = s.now().UTC()
	if err := statedir.WritePlugin(s.opts.StateDir, *s.record); err != nil {
		s.log.Error(err, "failed to refresh the plugin's heartbeat")
	}
}

func (s *server) healthMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.registered.Load() {
			http.Error(w, "not registered with the container runtime", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}

// nriLogger sends the NRI library's messages to the plugin's log: its
// routine chatter at V(1), its warnings and errors as they are.
type nriLogger struct{ log logr.Logger }

var _ nrilog.Logger = nriLogger{}

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.log.V(2).Info(lowerFirst(fmt.Sprintf(format, args...)))
}

func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.log.V(1).Info(lowerFirst(fmt.Sprintf(format, args...)))
}

func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.log.Info(lowerFirst(fmt.Sprintf(format, args...)))
}

func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.log.Error(errors.New(lowerFirst(fmt.Sprintf(format, args...))), "nri library error")
}

func lowerFirst(s string) string {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}
