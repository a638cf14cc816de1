// Command loadtest measures the webhook side by side with the floors of
// what any webhook costs, through a real kube-apiserver on loopback: the
// API server and etcd that hack/tools.sh built, N GPU nodes of several layouts (or N
// nodes of which a share are GPU nodes, the others CPU nodes), the
// gpu-injector webhook with the chart's webhook configuration, a no-op
// webhook, a webhook that answers at once with a patch the size of ours, and
// the in-tree MutatingAdmissionPolicy with the same static patch. It sends
// server-side dry-run creates of small, medium and large GPU pods at each
// concurrency and prints client p50/p99, pods/s and the API server's own mean
// admission time for each. Bounded in requests and time; docs/benchmarks.md
// records its figures. With -memory-only it measures only the webhook's
// memory as it reads the first list of Nodes, for each of several cluster
// sizes and container limits.
//
//	go run ./hack/loadtest -nodes 5000 -requests 300
//	go run ./hack/loadtest -memory-only -nodes 5000,20000,65000 -memory-limit none,256Mi
//	go run ./hack/loadtest -memory-only -nodes 65000 -gpu-fraction 0.1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/layout"
)

// maxNodes is the most nodes a run creates: past Kubernetes' tested 5,000
// nodes, up to the largest clusters that providers offer (65,000).
const maxNodes = 65000

type options struct {
	nodes int
	// gpuFraction is the share of the nodes that are GPU nodes; the others
	// are CPU nodes (cpuNode).
	gpuFraction float64
	// nodeCounts are the cluster sizes that -memory-only measures, ascending;
	// nodes is the first.
	nodeCounts []int
	// memoryLimits are the container limits in bytes that -memory-only
	// gives the webhook, as the chart does; 0 is none.
	memoryLimits []int64
	memoryOnly   bool
	readyTimeout time.Duration
	requests     int
	warmup       int
	cellTimeout  time.Duration
	timeout      time.Duration
	sizes        []string
	concurrency  []int
	variants     []string
	chartObjects string
	binary       string
	cacheDir     string
	keep         bool
	out          string
	nodeWorkers  int
	profileDir   string
	profileTime  time.Duration
	nri          bool
	// runtimeDelivery renders the chart with driverDelivery Runtime (and
	// implies nri): the gpu-injector variant is the webhook alone
	// (admission.policy off), chart-policy the chart's admission policy.
	runtimeDelivery bool
	// defaultValues renders the chart with its default values (and implies
	// nri): chart-policy is the chart's admission policy behind the switch
	// that gpu-injector's elected replica keeps, as a default install runs.
	defaultValues bool
	// refChart is another checkout whose chart's policy runs as the
	// chart-policy-ref variant.
	refChart string
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, o.timeout)
	defer cancelTimeout()
	if err := runAll(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// chartPolicies: the chart is rendered with its admission policy, whose
// variants then run.
func (o *options) chartPolicies() bool { return o.runtimeDelivery || o.defaultValues }

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	o := &options{}
	var sizes, conc, variants, nodes, limits string
	fs.StringVar(&nodes, "nodes", "5000", fmt.Sprintf("nodes to create, 1..%d; with -memory-only, a comma-separated list of cluster sizes, measured one after another on the same API server (the nodes are added)", maxNodes))
	fs.Float64Var(&o.gpuFraction, "gpu-fraction", 1, "share of the nodes that are GPU nodes, spread evenly (0.1: every tenth); the others are CPU nodes as the chart's probe labels them (state "+layout.StateNoDriver+")")
	fs.BoolVar(&o.memoryOnly, "memory-only", false, "measure only the webhook's memory: for each -nodes and -memory-limit, start it, wait until it is ready, and read its resident set (idle and high-water mark) and Go heap; no admission cells")
	fs.StringVar(&limits, "memory-limit", "none", "with -memory-only: comma-separated container memory limits (Kubernetes quantities, e.g. 256Mi; none: no limit) that the webhook is told of as the chart tells it (GPU_INJECTOR_MEMORY_LIMIT), so it sets the Go runtime's soft limit below each; the process itself is not confined")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 5*time.Minute, "how long the webhook may take to list the nodes and become ready")
	fs.BoolVar(&o.nri, "nri", false, "every node has gpu-injector's NRI plugin registered (label "+layout.LabelNRIPlugin+"), so gpu-injector injects at the runtime")
	fs.BoolVar(&o.runtimeDelivery, "runtime-delivery", false, "render the chart with config.driverDelivery=Runtime (implies -nri); the chart-policy variant then runs the chart's MutatingAdmissionPolicy beside the chart's webhook configuration, and gpu-injector is the webhook alone (admission.policy=off)")
	fs.BoolVar(&o.defaultValues, "default-values", false, "render the chart with its default values (driverDelivery PreferRuntime; implies -nri): the chart-policy variant then runs the chart's MutatingAdmissionPolicy and its binding, which gpu-injector's elected replica opens (the policy's switch), beside the chart's webhook configuration, and gpu-injector is the webhook alone (admission.policy=off)")
	fs.IntVar(&o.requests, "requests", 300, "measured requests per cell (variant x size x concurrency)")
	fs.IntVar(&o.warmup, "warmup", 30, "unmeasured requests before each cell")
	fs.DurationVar(&o.cellTimeout, "cell-timeout", 60*time.Second, "a cell stops at this time even if it has sent fewer requests")
	fs.DurationVar(&o.timeout, "timeout", 40*time.Minute, "the whole run stops at this time")
	fs.StringVar(&sizes, "sizes", "small,medium,large", "pod sizes; "+sizeCPU+" is the small pod without its GPU, in the same opted-in namespace")
	fs.StringVar(&conc, "concurrency", "1,16", "client concurrencies")
	fs.StringVar(&variants, "variants", strings.Join(defaultVariants, ","), "what admits the pods, of "+strings.Join(allVariants, ","))
	fs.StringVar(&o.refChart, "ref-chart", "", "with -runtime-delivery: the root of another checkout (git worktree add DIR main), whose chart's policy and webhook configuration run as the "+variantRefPolicy+" variant, to compare two versions of the policy in one run")
	fs.StringVar(&o.chartObjects, "chart-objects", "", "output of helm template for the chart (default: run hack/tools.sh's helm)")
	fs.StringVar(&o.binary, "gpu-injector", "", "gpu-injector binary (default: go build one)")
	fs.StringVar(&o.cacheDir, "bin", "", "folder of the cluster binaries (default: hack/tools.sh's cache, ~/.cache/gpu-injector)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's folder (logs, certificates, etcd)")
	fs.StringVar(&o.out, "o", "", "also write the table to this file")
	fs.IntVar(&o.nodeWorkers, "node-workers", 64, "concurrent requests while creating nodes (three requests a node, without client-side rate limit)")
	fs.StringVar(&o.profileDir, "profile", "", "write a CPU profile of gpu-injector for each of its cells, and of the API server for every cell, into this folder (go tool pprof reads them)")
	fs.DurationVar(&o.profileTime, "profile-time", 10*time.Second, "length of each CPU profile; a cell that ends sooner waits for it")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	o.sizes = strings.Split(sizes, ",")
	if !slices.ContainsFunc(o.sizes, func(s string) bool { return s != sizeCPU }) {
		return nil, errors.New("-sizes needs a GPU pod size besides " + sizeCPU)
	}
	if o.runtimeDelivery && o.defaultValues {
		return nil, errors.New("-runtime-delivery and -default-values render the chart two ways: choose one")
	}
	if o.chartPolicies() {
		o.nri = true
	}
	o.variants = strings.Split(variants, ",")
	for _, v := range o.variants {
		if !contains(allVariants, v) {
			return nil, fmt.Errorf("unknown variant %q; known: %s", v, strings.Join(allVariants, ","))
		}
	}
	if contains(o.variants, variantRefPolicy) != (o.refChart != "") || (o.refChart != "" && !o.chartPolicies()) {
		return nil, fmt.Errorf("-ref-chart and the %s variant go together, with -runtime-delivery or -default-values", variantRefPolicy)
	}
	for _, c := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("bad concurrency %q", c)
		}
		o.concurrency = append(o.concurrency, n)
	}
	var err error
	if o.nodeCounts, err = parseNodeCounts(nodes); err != nil {
		return nil, err
	}
	o.nodes = o.nodeCounts[0]
	if len(o.nodeCounts) > 1 && !o.memoryOnly {
		return nil, errors.New("several -nodes need -memory-only: the admission cells measure one cluster size")
	}
	if !(o.gpuFraction > 0 && o.gpuFraction <= 1) {
		return nil, fmt.Errorf("-gpu-fraction %v: want a share above 0, at most 1", o.gpuFraction)
	}
	if o.memoryLimits, err = parseMemoryLimits(limits); err != nil {
		return nil, err
	}
	if !o.memoryOnly && (len(o.memoryLimits) != 1 || o.memoryLimits[0] != 0) {
		return nil, errors.New("-memory-limit needs -memory-only")
	}
	if o.requests < 1 || o.requests > 100000 {
		return nil, errors.New("-requests must be 1..100000")
	}
	if o.nodeWorkers < 1 || o.nodeWorkers > 1024 {
		return nil, errors.New("-node-workers must be 1..1024")
	}
	return o, nil
}

// parseNodeCounts reads -nodes: cluster sizes, each 1..maxNodes, which it
// sorts, since each size adds nodes to the one before.
func parseNodeCounts(v string) ([]int, error) {
	var counts []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > maxNodes {
			return nil, fmt.Errorf("bad -nodes %q: want numbers 1..%d, comma-separated", s, maxNodes)
		}
		if slices.Contains(counts, n) {
			return nil, fmt.Errorf("-nodes names %d twice", n)
		}
		counts = append(counts, n)
	}
	slices.Sort(counts)
	return counts, nil
}

// parseMemoryLimits reads -memory-limit: Kubernetes quantities, "none" or 0
// for no limit, in the order given.
func parseMemoryLimits(v string) ([]int64, error) {
	var limits []int64
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "none" {
			limits = append(limits, 0)
			continue
		}
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("bad -memory-limit %q: want quantities such as 256Mi, or none", s)
		}
		limits = append(limits, q.Value())
	}
	return limits, nil
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func runAll(ctx context.Context, o *options) (err error) {
	if o.cacheDir == "" {
		if o.cacheDir, err = cluster.CacheDir(); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "gpu-injector-loadtest-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep || err != nil {
			fmt.Fprintf(os.Stderr, "kept %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	etcd := filepath.Join(o.cacheDir, "etcd-"+cluster.EtcdVersion, "etcd")
	apiserver := filepath.Join(o.cacheDir, "kubernetes-"+cluster.KubernetesVersion, "kube-apiserver")
	for _, b := range []string{etcd, apiserver} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: run hack/tools.sh all first", b)
		}
	}
	start := time.Now()
	progress("starting etcd and kube-apiserver %s in %s", cluster.KubernetesVersion, dir)
	cp, err := startControlPlane(ctx, dir, etcd, apiserver, o.profileDir != "")
	if cp != nil {
		defer cp.stop()
	}
	if err != nil {
		return err
	}
	var table string
	if o.memoryOnly {
		if table, err = measureMemory(ctx, o, dir, cp); err != nil {
			return err
		}
	} else {
		r, err := newRun(ctx, o, dir, cp)
		if r != nil {
			defer r.close()
		}
		if err != nil {
			return err
		}
		if err := r.measure(ctx); err != nil {
			return err
		}
		table = r.table()
	}
	fmt.Println(table)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(table), 0o644); err != nil {
			return err
		}
	}
	progress("done in %s", time.Since(start).Round(time.Second))
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
