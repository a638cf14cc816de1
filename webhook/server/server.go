// Package server is gpu-injector's admission server: TLS and its
// certificates, the AdmissionReview decoding, the handler that calls the
// injection (package inject) with the candidates of the node index (package
// gpunodes), and the metrics. `gpu-injector webhook` runs it.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/version"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

// Options are the webhook's process plumbing; its behaviour is Config.
type Options struct {
	// Config is the injector configuration (config.Load).
	Config *config.Configuration
	// RESTConfig reaches the API server.
	RESTConfig *rest.Config
	// Log is the webhook's logger.
	Log logr.Logger
	// Port is the HTTPS port of the webhook server.
	Port int
	// Certs say where the serving certificate comes from.
	Certs CertOptions
	// MetricsAddr serves the Prometheus metrics; "0" disables them.
	MetricsAddr string
	// ProbeAddr serves /healthz and /readyz.
	ProbeAddr string
	// PprofAddr serves Go's /debug/pprof endpoints; empty disables them.
	PprofAddr string
	// PoolMemory names the ConfigMap (and leader election Lease) in
	// Certs.Namespace that remembers each pool's layout; empty: no memory.
	PoolMemory string
	// PolicyBinding names the chart's MutatingAdmissionPolicyBinding under
	// driverDelivery PreferRuntime: the elected replica opens it while the
	// policy answers as the webhook would (gpunodes.PolicySwitch); empty:
	// no switch.
	PolicyBinding string
	// ShutdownDelay is how long the webhook keeps serving after ctx ends,
	// with /readyz failing, before it drains the requests in flight.
	ShutdownDelay time.Duration
	// MaxInFlight bounds the admissions served at once.
	MaxInFlight int
	// ReadTimeout bounds how long a request's body may take to arrive.
	ReadTimeout time.Duration
	// ClientCA names a file of Certs.Dir: when set, only clients with a
	// certificate it signed (the API server's, through its
	// AdmissionConfiguration kubeConfigFile) are served.
	ClientCA string
}

// Run serves Pod admission on Path until ctx ends (`gpu-injector webhook`).
func Run(ctx context.Context, o Options) error {
	log := o.Log
	// Before the first list of Nodes, whose garbage would otherwise grow the
	// heap past the container's limit (docs/helm.md, "Memory").
	memoryLimit := nodeagent.SetMemoryLimit(log)

	cfg := o.Config
	excludeOwnNamespace(cfg, o.Certs.Namespace)
	restCfg := o.RESTConfig

	var holdWhy error
	if memoryLimit > 0 {
		_, containerLimit, _, _ := nodeagent.MemoryLimit(os.Getenv)
		holdWhy = checkListMemory(ctx, restCfg, memoryLimit, containerLimit, log)
	}

	SetBuildInfo(version.Version)
	log.Info("starting the webhook", "version", version.String(), "certMode", o.Certs.Mode, "namespace", o.Certs.Namespace,
		"excludedNamespaces", cfg.ExcludedNamespaces, "layoutPolicy", cfg.LayoutPolicy, "noLayout", cfg.NoLayout.Action,
		"pinningNodeLabels", cfg.Pinning.NodeLabels, "rememberFor", cfg.Pinning.Remember().String())

	idx := gpunodes.NewIndex(cfg, log.WithName("nodes"))
	dc, err := discovery.NewDiscoveryClientForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("failed to create the discovery client: %w", err)
	}
	// Kubernetes 1.34+ serves resource.k8s.io/v1: GPUs may come through DRA,
	// counted from ResourceSlices and claimed through DeviceClasses. An older
	// API server gets no DRA kinds in the cache, which would fail its start.
	draServed, err := gpunodes.DRAServed(dc)
	if err != nil {
		return err
	}
	el := electedWork(o, log)
	server := webhook.NewServer(webhook.Options{Port: o.Port, CertDir: o.Certs.Dir, CertName: certFile, KeyName: keyFile, ClientCAName: o.ClientCA})
	mgr, err := newManager(o, server, el.any(), cacheByObject(o, draServed, el))
	if err != nil {
		return err
	}
	mgrCtx, stopMgr, draining := drainAfter(ctx, o.ShutdownDelay, log)
	defer stopMgr()

	if err := startIndex(mgrCtx, restCfg, idx, holdWhy, log); err != nil {
		return err
	}
	dra, err := watchDRA(mgrCtx, draServed, cfg, idx, mgr, dc, log)
	if err != nil {
		return err
	}
	namespaces, err := WatchNamespaces(mgrCtx, mgr.GetCache())
	if err != nil {
		return err
	}
	if err := addElected(mgrCtx, mgr, o, idx, el, log); err != nil {
		return err
	}
	certsReady, err := serveCerts(mgrCtx, mgr, o.Certs, log.WithName("certs"))
	if err != nil {
		return err
	}

	handler := newHandler(o, idx, namespaces, dra, mgr.GetAPIReader(), log)
	server.Register(Path, closeWhileDraining(draining, bounded(Serve(handler), o.MaxInFlight, o.ReadTimeout)))
	if err := mgr.Add(startAfter{ready: certsReady, server: server}); err != nil {
		return fmt.Errorf("failed to add the webhook server: %w", err)
	}
	if err := addChecks(mgr, server, idx, namespaces, dra, draining); err != nil {
		return err
	}
	if err := mgr.Start(mgrCtx); err != nil {
		return fmt.Errorf("failed to run the webhook: %w", err)
	}
	return nil
}

// excludeOwnNamespace adds the webhook's namespace, when it has one, to the
// namespaces it never injects: the webhook must never wait on itself to
// create its own pods.
func excludeOwnNamespace(cfg *config.Configuration, namespace string) {
	if namespace != "" && !slices.Contains(cfg.ExcludedNamespaces, namespace) {
		cfg.ExcludedNamespaces = append(slices.Clone(cfg.ExcludedNamespaces), namespace)
	}
}

// elected is what the one elected replica (a Lease named like the pool
// memory) does: pinning by pool and the policy switch elect it to write the
// memory, to tell pods that landed on another layout, and to keep the
// switch.
type elected struct {
	// pools: pinning by pool, with its mismatch Events.
	pools bool
	// remember: pools keeps the memory of pools at zero.
	remember bool
	// switches: the admission policy switch is kept.
	switches bool
}

// any reports whether a replica must be elected at all.
func (e elected) any() bool { return e.pools || e.switches }

// electedWork says what the elected replica does: the pinning and the
// switch that the configuration asks for, each only where a Lease can be
// named, saying so when one cannot.
func electedWork(o Options, log logr.Logger) elected {
	cfg := o.Config
	canElect := o.PoolMemory != "" && o.Certs.Namespace != ""
	pools := cfg.Pinning.ByPool() && canElect
	if cfg.Pinning.ByPool() && !pools {
		log.Info("pinning by pool without --namespace or --pool-memory-name: no memory of pools at zero and no mismatch Events")
	}
	switches := o.PolicyBinding != "" && canElect
	if o.PolicyBinding != "" && !switches {
		log.Info("a policy switch without --namespace or --pool-memory-name (its Lease): the admission policy stays off")
	}
	return elected{pools: pools, remember: pools && cfg.Pinning.Remember() > 0, switches: switches}
}

// cacheByObject is what the manager's cache holds beyond its defaults: the
// DRA kinds where they are served, and only the objects the webhook reads.
func cacheByObject(o Options, draServed bool, el elected) map[client.Object]cache.ByObject {
	byObject := map[client.Object]cache.ByObject{}
	if draServed {
		maps.Copy(byObject, gpunodes.DRACacheByObject())
	}
	if o.Certs.Mode == CertModeSelf && o.Certs.Namespace != "" {
		// Only the one Secret, only to copy it into --cert-dir.
		byObject[&corev1.Secret{}] = cache.ByObject{
			Namespaces: map[string]cache.Config{o.Certs.Namespace: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", o.Certs.SecretName),
		}
	}
	if el.remember {
		byObject[&corev1.ConfigMap{}] = gpunodes.MemoryCacheByObject(o.Certs.Namespace, o.PoolMemory)
	}
	if el.pools {
		byObject[&corev1.Pod{}] = gpunodes.PodCacheByObject()
	}
	return byObject
}

// newManager is the manager that serves server, elects a replica when
// elect, and caches byObject.
func newManager(o Options, server webhook.Server, elect bool, byObject map[client.Object]cache.ByObject) (manager.Manager, error) {
	mgr, err := manager.New(o.RESTConfig, manager.Options{
		Scheme: clientgoscheme.Scheme,
		Logger: o.Log,
		// Only the memory's writer is elected; every replica serves.
		LeaderElection:                elect,
		LeaderElectionID:              o.PoolMemory,
		LeaderElectionNamespace:       o.Certs.Namespace,
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.ProbeAddr,
		PprofBindAddress:              o.PprofAddr,
		WebhookServer:                 server,
		Cache: cache.Options{
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject:         byObject,
			// Reads of anything not set up here fail instead of silently
			// starting a cluster-wide watch that RBAC would refuse.
			ReaderFailOnMissingInformer: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("failed to create the manager: %w", err)
	}
	return mgr, nil
}

// drainAfter is the manager's context, which ends shutdownDelay after ctx,
// and draining, which turns true when ctx ends. A replica that closes its
// port at SIGTERM fails every request the API server sends it until the
// endpoint removal reaches the API server (and keep-alive connection sticks
// to one replica). So the manager runs on a context of its own: meanwhile
// the server keeps answering and /readyz fails; then the server drains the
// requests in flight (http.Server.Shutdown) and the process exits.
func drainAfter(ctx context.Context, shutdownDelay time.Duration, log logr.Logger) (context.Context, context.CancelFunc, *atomic.Bool) {
	mgrCtx, stopMgr := context.WithCancel(context.WithoutCancel(ctx))
	var draining atomic.Bool
	go func() {
		select {
		case <-ctx.Done():
		case <-mgrCtx.Done():
			return
		}
		draining.Store(true)
		log.Info("stopping: not ready any more, serving on until the endpoint is gone", "shutdownDelay", shutdownDelay.String())
		select {
		case <-time.After(shutdownDelay):
		case <-mgrCtx.Done():
		}
		log.Info("stopping: draining the requests in flight")
		stopMgr()
	}()
	return mgrCtx, stopMgr, &draining
}

// startIndex fills the node index from a watch of the GPU nodes, or, when
// holdWhy says the memory limit is too small for the first list, holds.
// Started with the caches, not after them as a manager runnable would be:
// the pool memory's writer waits for the index.
func startIndex(ctx context.Context, restCfg *rest.Config, idx *gpunodes.Index, holdWhy error, log logr.Logger) error {
	nodeLW, err := gpunodes.NodeListWatch(restCfg)
	if err != nil {
		return err
	}
	if holdWhy != nil {
		// Not ready, and saying why, rather than killed for its memory over
		// and over: a crash loop says only OOMKilled.
		go repeatHold(ctx, holdWhy, log)
		return nil
	}
	paceFirstList(ctx, idx, log)
	go idx.Watch(ctx, nodeLW)
	return nil
}

// watchDRA fills the DRA cache of the GPUs that ResourceSlices offer and
// DeviceClasses claim, saying when the API server may drop what it reads
// of them. Where DRA is not served there is no cache: nil.
func watchDRA(ctx context.Context, draServed bool, cfg *config.Configuration, idx *gpunodes.Index, mgr manager.Manager, dc discovery.DiscoveryInterface, log logr.Logger) (*gpunodes.DRA, error) {
	if !draServed {
		log.Info("the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34+): GPUs are counted from Node allocatable only, and a pod that claims a GPU DeviceClass is not seen as a GPU pod")
		return nil, nil
	}
	dra := gpunodes.NewDRA(cfg, idx, mgr.GetAPIReader(), log.WithName("dra"))
	if err := dra.Watch(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	// The field that names a DeviceClass's extended resource arrived with
	// DRA extended resources (1.36); an older API server drops it.
	switch v, err := serverVersion(dc); {
	case err != nil:
		log.Error(err, "failed to read the API server's version; DeviceClasses are read as the API server serves them")
	case v.LessThan(utilversion.MajorMinor(1, 36)):
		log.Info("the API server predates DRA extended resources (Kubernetes 1.36): it keeps a DeviceClass's extendedResourceName only with the DRAExtendedResource feature gate on; the names in resources.names are GPU resources either way", "serverVersion", v.String())
	}
	return dra, nil
}

// addElected adds the elected replica's runnables: the pool memory's writer,
// the layout mismatch check and the admission policy switch.
func addElected(ctx context.Context, mgr manager.Manager, o Options, idx *gpunodes.Index, el elected, log logr.Logger) error {
	cfg := o.Config
	if el.remember {
		memory := gpunodes.NewMemory(cfg, idx, mgr.GetClient(), o.Certs.Namespace, o.PoolMemory, log.WithName("pools"))
		if err := memory.Watch(ctx, mgr.GetCache()); err != nil {
			return err
		}
		if err := mgr.Add(memory); err != nil {
			return fmt.Errorf("failed to add the pool memory writer: %w", err)
		}
	}
	if el.pools {
		m := gpunodes.NewMismatches(idx, mgr.GetEventRecorderFor("gpu-injector-webhook"), log.WithName("mismatch"))
		if err := mgr.Add(mismatchRunner{m: m, c: mgr.GetCache()}); err != nil {
			return fmt.Errorf("failed to add the layout mismatch check: %w", err)
		}
	}
	if el.switches {
		// The API reader: the cache holds no bindings, and one object read
		// once a resync needs no informer.
		sw := gpunodes.NewPolicySwitch(cfg, idx, mgr.GetAPIReader(), mgr.GetClient(), o.PolicyBinding, log.WithName("policy"))
		if err := mgr.Add(sw); err != nil {
			return fmt.Errorf("failed to add the admission policy switch: %w", err)
		}
	}
	return nil
}

// serveCerts sets up the serving certificate (setupCerts), whose channel
// closes once it is in --cert-dir, and in self mode keeps the files up to
// date with the Secret.
func serveCerts(ctx context.Context, mgr manager.Manager, o CertOptions, log logr.Logger) (<-chan struct{}, error) {
	certsReady, err := setupCerts(mgr, o, log)
	if err != nil {
		return nil, err
	}
	if o.Mode == CertModeSelf {
		if err := watchSecretFiles(ctx, mgr.GetCache(), o.Dir, log); err != nil {
			return nil, err
		}
	}
	return certsReady, nil
}

// newHandler is the admission handler over the node index, the namespaces,
// the DRA cache (nil where DRA is not served) and, where the configuration
// reads them, the images (their pull secrets through reader).
func newHandler(o Options, idx *gpunodes.Index, namespaces *NamespaceCache, dra *gpunodes.DRA, reader client.Reader, log logr.Logger) *Handler {
	cfg := o.Config
	handler := NewHandler(cfg, idx, namespaces).WithDRA(dra)
	if cfg.Images.Mode != config.ImagesOn {
		return handler
	}
	var secrets imageconfig.SecretGetter
	if cfg.Images.PullSecrets == config.PullSecretsRead {
		secrets = apiSecrets{reader: reader}
		if o.ClientCA == "" {
			// The binary cannot see a NetworkPolicy, which the chart
			// requires when client certificates are not verified; a
			// webhook run otherwise must have one of its own.
			log.Info("pull secrets are read for any caller that reaches the webhook's port: only a NetworkPolicy keeps out reviews of other namespaces", "clientCA", false, "pullSecrets", cfg.Images.PullSecrets)
		}
	}
	return handler.WithImages(NewImageReader(&cfg.Images, log.WithName("images")), secrets)
}

// addChecks adds the readiness checks (the server started, the node index
// and the namespaces listed, the DRA cache where there is one, not shutting
// down) and the liveness check.
func addChecks(mgr manager.Manager, server webhook.Server, idx *gpunodes.Index, namespaces *NamespaceCache, dra *gpunodes.DRA, draining *atomic.Bool) error {
	checks := map[string]healthz.Checker{
		"webhook":    server.StartedChecker(),
		"nodes":      idx.ReadyCheck,
		"namespaces": namespaces.ReadyCheck,
		"shutdown": func(*http.Request) error {
			if draining.Load() {
				return errors.New("shutting down")
			}
			return nil
		},
	}
	if dra != nil {
		checks["dra"] = dra.ReadyCheck
	}
	for name, check := range checks {
		if err := mgr.AddReadyzCheck(name, check); err != nil {
			return fmt.Errorf("failed to add the %s readiness check: %w", name, err)
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("failed to add the liveness check: %w", err)
	}
	return nil
}

// serverVersion is the API server's Kubernetes version.
func serverVersion(dc discovery.DiscoveryInterface) (*utilversion.Version, error) {
	info, err := dc.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("failed to read the API server's version: %w", err)
	}
	return utilversion.ParseGeneric(info.GitVersion)
}

// closeWhileDraining asks each client to move to another connection once
// the replica is shutting down. The API server calls a webhook behind a
// Service over HTTP/1.1 keep-alive connections (it asks for http/1.1 so that
// its calls spread over the replicas) and reuses each one, so removing this
// replica's endpoint moves no traffic: only the connection's end does, and
// if that end is the server's Shutdown, a request written as it closes fails
// ("broken pipe"; the API server does not retry an admission).
// "Connection: close" on a response closes an HTTP/1.1 connection after that
// response and makes Go's HTTP/2 server send a graceful GOAWAY: requests
// already sent are answered, and the client's next requests dial anew,
// through the Service, to a ready replica.
func closeWhileDraining(draining *atomic.Bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// mismatchRunner runs Mismatches on the elected replica.
type mismatchRunner struct {
	m *gpunodes.Mismatches
	c cache.Cache
}

func (r mismatchRunner) Start(ctx context.Context) error { return r.m.Run(ctx, r.c) }

// NeedLeaderElection: one replica reads pods and writes Events.
func (mismatchRunner) NeedLeaderElection() bool { return true }

// listGCPercent is the collector's pace while the first list of Nodes
// streams. Each Node decodes into far more than the index keeps of it, and
// at the default pace that garbage is let grow to what is live; collecting
// more often costs the list's CPU, once, for a peak close to what the index
// keeps (docs/helm.md, "Memory").
const listGCPercent = 25

// paceFirstList collects garbage at listGCPercent until the index holds the
// first list (whose store then gives the freed memory back to the system),
// then restores the pace it found (GOGC). A collector turned off, or one
// already collecting more often, is left as it is.
func paceFirstList(ctx context.Context, idx *gpunodes.Index, log logr.Logger) {
	prev := debug.SetGCPercent(listGCPercent)
	if prev < 0 || prev <= listGCPercent {
		debug.SetGCPercent(prev)
		return
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for !idx.Ready() {
			select {
			case <-ctx.Done():
				debug.SetGCPercent(prev)
				return
			case <-t.C:
			}
		}
		debug.SetGCPercent(prev)
		log.V(1).Info("first list of nodes indexed: garbage collection back to its pace", "gcPercent", prev)
	}()
}

// firstListPeak is the Go memory (the resident set less the binary's
// pages) that the first list of this many GPU nodes took in the
// measurements of docs/helm.md, "Memory" (nodes of a GPU operator's labels),
// as a fixed part and a part per node.
func firstListPeak(nodes int64) int64 { return 12<<20 + nodes*2600 }

// binaryPages is what the container's memory holds of the binary's file
// besides the Go runtime's own memory, rounded up from the same
// measurements.
const binaryPages = 32 << 20

// listVerdict judges a memory limit against a first list of that many GPU
// nodes (firstListPeak): hold when even the container's limit is below what
// the list took, so the container would be killed while it lists; warn when
// the soft limit is below it, so the collector works hard to stay under.
// need is the measured figure, the binary's pages included.
func listVerdict(nodes, soft, container int64) (hold, warn bool, need int64) {
	need = firstListPeak(nodes) + binaryPages
	return container > 0 && need > container, soft > 0 && need-binaryPages > soft, need
}

// checkListMemory counts the nodes of the first list (countListNodes) and
// judges the memory limit against them (listVerdict). It returns why the
// webhook must not list, or nil. A failure to count is logged and changes
// nothing. An explicit GOMEMLIMIT, which the operator chose, is never
// judged: soft is then the runtime's and container 0.
func checkListMemory(ctx context.Context, cfg *rest.Config, soft, container int64, log logr.Logger) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Error(err, "failed to count the nodes against the memory limit")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nodes, err := countListNodes(ctx, cs, func(n int64) bool {
		hold, warn, _ := listVerdict(n, soft, container)
		return hold || warn
	})
	if err != nil {
		log.Error(err, "failed to count the nodes against the memory limit")
		return nil
	}
	hold, warn, need := listVerdict(nodes, soft, container)
	switch {
	case hold:
		// Room for what the list took and a quarter more, in 64 MiB steps.
		raise := (need*5/4 + 64<<20 - 1) / (64 << 20) * 64
		err := fmt.Errorf("the container's memory limit %s is below the %s that the first list of %d GPU nodes took when measured: not listing, so not ready, rather than killed while listing; raise webhook.resources.limits.memory to %dMi or more (docs/helm.md, Memory), or set GOMEMLIMIT on the container to list anyway",
			mibString(container), mibString(need), nodes, raise)
		log.Error(err, "not listing the nodes, so not ready: the memory limit is too small")
		return err
	case warn:
		log.Info("warning: the memory limit may be too small for the first list of this many GPU nodes; if the container is OOMKilled, raise webhook.resources.limits.memory (docs/helm.md, Memory)",
			"nodes", nodes, "memoryLimit", mibString(soft), "measuredPeak", mibString(need-binaryPages))
	}
	return nil
}

// countPageSize is the rows of one page when countListNodes counts the
// GPU nodes one by one: a page of names, not of Nodes.
const countPageSize = 5000

// countListNodes counts the nodes the index will list: those that
// gpunodes.ProbedNodes selects. An API server tells how many items remain
// only of a list without a selector, so it counts every Node first (a list
// of one Node, whose answer says how many remain); only where that many
// would be judged short of memory (short) does it count the GPU nodes
// themselves, as pages of a table of their names.
func countListNodes(ctx context.Context, cs kubernetes.Interface, short func(int64) bool) (int64, error) {
	l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return 0, fmt.Errorf("failed to count the nodes: %w", err)
	}
	all := int64(len(l.Items))
	if l.RemainingItemCount != nil {
		all += *l.RemainingItemCount
	}
	if !short(all) {
		return all, nil
	}
	opts := metav1.ListOptions{LabelSelector: gpunodes.ProbedNodes().String(), Limit: countPageSize}
	var gpuNodes int64
	for {
		raw, err := cs.CoreV1().RESTClient().Get().Resource("nodes").VersionedParams(&opts, metav1.ParameterCodec).
			Param("includeObject", string(metav1.IncludeNone)).
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
		if err != nil {
			return 0, fmt.Errorf("failed to count the GPU nodes: %w", err)
		}
		var t metav1.Table
		if err := json.Unmarshal(raw, &t); err != nil {
			return 0, fmt.Errorf("failed to count the GPU nodes: %w", err)
		}
		gpuNodes += int64(len(t.Rows))
		if t.Continue == "" {
			return gpuNodes, nil
		}
		opts.Continue = t.Continue
	}
}

// repeatHold says every minute why the webhook is not ready, so that the
// reason is in any stretch of its log an operator reads.
func repeatHold(ctx context.Context, why error, log logr.Logger) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			log.Error(why, "not listing the nodes, so not ready: the memory limit is too small")
		}
	}
}

func mibString(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
