// Command loadtest measures the webhook side by side with the floors of
// what any webhook costs, through a real kube-apiserver on loopback: the
// API server and etcd that hack/tools.sh built, N GPU nodes of several layouts, the
// gpu-injector webhook with the chart's webhook configuration, a no-op
// webhook, a webhook that answers at once with a patch the size of ours, and
// the in-tree MutatingAdmissionPolicy with the same static patch. It sends
// server-side dry-run creates of small, medium and large GPU pods at each
// concurrency and prints client p50/p99, pods/s and the API server's own mean
// admission time for each. Bounded in requests and time; docs/benchmarks.md
// records its figures.
//
//	go run ./hack/loadtest -nodes 5000 -requests 300
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/layout"
)

type options struct {
	nodes        int
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

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	o := &options{}
	var sizes, conc, variants string
	fs.IntVar(&o.nodes, "nodes", 5000, "GPU nodes to create")
	fs.BoolVar(&o.nri, "nri", false, "every node has gpu-injector's NRI plugin registered (label "+layout.LabelNRIPlugin+"), so gpu-injector injects at the runtime")
	fs.IntVar(&o.requests, "requests", 300, "measured requests per cell (variant x size x concurrency)")
	fs.IntVar(&o.warmup, "warmup", 30, "unmeasured requests before each cell")
	fs.DurationVar(&o.cellTimeout, "cell-timeout", 60*time.Second, "a cell stops at this time even if it has sent fewer requests")
	fs.DurationVar(&o.timeout, "timeout", 40*time.Minute, "the whole run stops at this time")
	fs.StringVar(&sizes, "sizes", "small,medium,large", "pod sizes")
	fs.StringVar(&conc, "concurrency", "1,16", "client concurrencies")
	fs.StringVar(&variants, "variants", strings.Join(allVariants, ","), "what admits the pods")
	fs.StringVar(&o.chartObjects, "chart-objects", "", "output of helm template for the chart (default: run hack/tools.sh's helm)")
	fs.StringVar(&o.binary, "gpu-injector", "", "gpu-injector binary (default: go build one)")
	fs.StringVar(&o.cacheDir, "bin", "", "folder of the cluster binaries (default: hack/tools.sh's cache, ~/.cache/gpu-injector)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run's folder (logs, certificates, etcd)")
	fs.StringVar(&o.out, "o", "", "also write the table to this file")
	fs.IntVar(&o.nodeWorkers, "node-workers", 32, "concurrent requests while creating nodes")
	fs.StringVar(&o.profileDir, "profile", "", "write a CPU profile of gpu-injector for each of its cells into this folder (go tool pprof reads them)")
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
	o.variants = strings.Split(variants, ",")
	for _, v := range o.variants {
		if !contains(allVariants, v) {
			return nil, fmt.Errorf("unknown variant %q; known: %s", v, strings.Join(allVariants, ","))
		}
	}
	for _, c := range strings.Split(conc, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("bad concurrency %q", c)
		}
		o.concurrency = append(o.concurrency, n)
	}
	if o.nodes < 1 || o.nodes > 20000 || o.requests < 1 || o.requests > 100000 {
		return nil, errors.New("-nodes must be 1..20000 and -requests 1..100000")
	}
	return o, nil
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
	cp, err := startControlPlane(ctx, dir, etcd, apiserver)
	if cp != nil {
		defer cp.stop()
	}
	if err != nil {
		return err
	}
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
	table := r.table()
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
