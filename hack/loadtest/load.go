package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// loader sends server-side dry-run creates straight over HTTP/2, the body
// encoded once, so the client spends as little of the machine as it can.
type loader struct {
	r      *run
	client *http.Client
	url    string
}

func newLoader(r *run) (*loader, error) {
	ca, err := os.ReadFile(r.cp.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", r.cp.caFile)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64}
	return &loader{r: r, client: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		url: r.cp.url + "/api/v1/namespaces/" + namespace + "/pods?dryRun=All&fieldManager=loadtest"}, nil
}

func (l *loader) create(ctx context.Context, size string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(l.r.pods[size]))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+l.r.cp.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("dry-run create of the %s pod: HTTP %d: %.500s", size, resp.StatusCode, body)
	}
	return body, nil
}

type result struct {
	variant, size    string
	concurrency, n   int
	errors           int
	p50, p99         time.Duration
	rate             float64
	webhookMean      float64 // ms, the API server's mean call of this webhook; NaN when none
	pluginMean       float64 // ms, the API server's mean of the mutating plugin that ran
	handlerMean      float64 // ms, controller-runtime's mean inside gpu-injector; NaN for others
	rssPeakKiBInCell int64
}

func (r *run) measure(ctx context.Context) error {
	l, err := newLoader(r)
	if err != nil {
		return err
	}
	for _, v := range r.o.variants {
		if err := r.configure(ctx, v); err != nil {
			return fmt.Errorf("failed to set up %s: %w", v, err)
		}
		if err := r.awaitSwitch(ctx, l, v); err != nil {
			return err
		}
		progress("variant %s", v)
		for _, size := range r.o.sizes {
			for _, c := range r.o.concurrency {
				res, err := r.cell(ctx, l, v, size, c)
				if err != nil {
					return err
				}
				progress("  %-6s c=%-2d n=%d p50 %.2fms p99 %.2fms %.0f pods/s webhook %.2fms plugin %.2fms handler %.2fms", size, c, res.n,
					ms(res.p50), ms(res.p99), res.rate, res.webhookMean, res.pluginMean, res.handlerMean)
				r.results = append(r.results, res)
			}
		}
	}
	return r.configure(ctx, variantNone)
}

func (r *run) cell(ctx context.Context, l *loader, v, size string, conc int) (result, error) {
	res := result{variant: v, size: size, concurrency: conc, webhookMean: math.NaN(), handlerMean: math.NaN()}
	if _, _, err := r.send(ctx, l, size, conc, r.o.warmup, r.o.cellTimeout); err != nil {
		return res, err
	}
	before, err := r.cp.scrape(ctx)
	if err != nil {
		return res, err
	}
	var hBefore metrics
	if v == variantOurs {
		if hBefore, err = scrapeURL(ctx, http.DefaultClient, r.webhookMetrics, ""); err != nil {
			return res, err
		}
	}
	stopSampler := r.sampleRSS(v == variantOurs, &res.rssPeakKiBInCell)
	profiled := r.profile(ctx, v, size, conc)
	lat, wall, err := r.send(ctx, l, size, conc, r.o.requests, r.o.cellTimeout)
	stopSampler()
	if perr := profiled(); err == nil {
		err = perr
	}
	if err != nil {
		return res, err
	}
	after, err := r.cp.scrape(ctx)
	if err != nil {
		return res, err
	}
	res.n = len(lat)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	res.rate = float64(len(lat)) / wall.Seconds()
	plugin := "MutatingAdmissionWebhook"
	switch v {
	case variantPolicy:
		plugin = "MutatingAdmissionPolicy"
	case variantNone:
	default:
		res.webhookMean = after.mean(before, webhookKey(webhookName(v)))
	}
	res.pluginMean = after.mean(before, pluginKey(plugin))
	if v == variantChartPolicy || v == variantRefPolicy {
		// Every pod passes both plugins: the policy's, and the webhook's,
		// which evaluates its matchConditions even where it calls no webhook.
		res.pluginMean += after.mean(before, pluginKey("MutatingAdmissionPolicy"))
	}
	if v == variantOurs {
		hAfter, err := scrapeURL(ctx, http.DefaultClient, r.webhookMetrics, "")
		if err != nil {
			return res, err
		}
		res.handlerMean = hAfter.mean(hBefore, "controller_runtime_webhook_latency_seconds|/mutate-v1-pod")
	}
	return res, nil
}

// send makes n dry-run creates with conc workers, or fewer if limit passes.
func (r *run) send(ctx context.Context, l *loader, size string, conc, n int, limit time.Duration) ([]time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var next atomic.Int64
	lat := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				t := time.Now()
				if _, err := l.create(ctx, size); err != nil {
					if ctx.Err() == nil {
						errs[w] = err
					}
					return
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var all []time.Duration
	for w := range conc {
		if errs[w] != nil {
			return nil, 0, errs[w]
		}
		all = append(all, lat[w]...)
	}
	if len(all) == 0 {
		return nil, 0, fmt.Errorf("no %s request finished within %s", size, limit)
	}
	return all, wall, nil
}

// profile takes CPU profiles while a cell runs, when -profile is set: the API
// server's for every variant (where its admission plugins spend their time),
// and gpu-injector's for its own. The returned function waits for them and
// writes them.
func (r *run) profile(ctx context.Context, v, size string, conc int) func() error {
	if r.o.profileDir == "" {
		return func() error { return nil }
	}
	seconds := strconv.Itoa(int(r.o.profileTime.Seconds()))
	type profiled struct {
		what, file string
		err        error
	}
	done := make(chan profiled, 2)
	n := 1
	go func() {
		file := filepath.Join(r.o.profileDir, fmt.Sprintf("kube-apiserver-%s-%s-c%d.pprof", v, size, conc))
		data, err := r.cp.client.Discovery().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", seconds).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(file, data, 0o644)
		}
		if err != nil {
			err = fmt.Errorf("failed to profile the API server: %w", err)
		}
		done <- profiled{"the API server", file, err}
	}()
	if v == variantOurs && r.webhookPprof != "" {
		n++
		go func() {
			file := filepath.Join(r.o.profileDir, fmt.Sprintf("gpu-injector-%s-c%d.pprof", size, conc))
			done <- profiled{"gpu-injector", file, fetchToFile(ctx, r.webhookPprof+"?seconds="+seconds, file)}
		}()
	}
	return func() error {
		var errs []error
		for range n {
			p := <-done
			if p.err != nil {
				errs = append(errs, p.err)
				continue
			}
			progress("  CPU profile of %s: %s", p.what, p.file)
		}
		return errors.Join(errs...)
	}
}

// gaugeStepKiB is how much a resident peak must grow before the webhook's
// gauges are read again.
const gaugeStepKiB = 1024

// sampleRSS records the webhook's peak resident set while a cell runs.
func (r *run) sampleRSS(on bool, peak *int64) func() {
	if !on {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := procMemory(r.webhookProc.Process.Pid); err == nil {
				*peak = max(*peak, m.rss)
				if m.rss > r.rssPeakKiB {
					r.rssPeakKiB, r.rssPeakAnonKiB, r.rssPeakFileKiB = m.rss, m.anon, m.file
					// The gauges are read at a new peak, milliseconds after
					// it, but only once it is gaugeStepKiB above the last
					// read: while the resident set grows a few pages a
					// sample, a read at every peak made the webhook encode
					// its metrics several times a second, which slowed the
					// requests being measured.
					if m.rss >= r.gaugedKiB+gaugeStepKiB {
						if g, err := scrapeURL(context.Background(), http.DefaultClient, r.webhookMetrics, ""); err == nil {
							r.peakGauges, r.gaugedKiB = g, m.rss
						}
					}
				}
				r.rssHWMKiB = m.hwm
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// metrics holds histogram sums and counts by "metric|name label".
type metrics map[string][2]float64

// heapInUse is the Go runtime's gauge of heap spans in use, which
// controller-runtime's metrics carry.
const heapInUse = "go_memstats_heap_inuse_bytes"

// The Go runtime's gauges that say where a resident peak goes: the live
// heap at the last collection, the heap size the collector lets it grow to
// (twice the live heap, GOGC=100), the free pages not yet returned to the
// OS, and the unused part of the spans in use.
const (
	heapLive   = "go_gc_heap_live_bytes"
	heapGoal   = "go_gc_heap_goal_bytes"
	heapFree   = "go_memory_classes_heap_free_bytes"
	heapUnused = "go_memory_classes_heap_unused_bytes"
)

var runtimeGauges = []string{heapInUse, heapLive, heapGoal, heapFree, heapUnused}

func webhookKey(name string) string {
	return "apiserver_admission_webhook_admission_duration_seconds|" + name
}

func pluginKey(name string) string {
	return "apiserver_admission_controller_admission_duration_seconds|" + name
}

func (m metrics) webhookCount(name string) float64 { return m[webhookKey(name)][1] }

// mean is the mean in ms of what was observed between before and m.
func (m metrics) mean(before metrics, key string) float64 {
	ds, dc := m[key][0]-before[key][0], m[key][1]-before[key][1]
	if dc <= 0 {
		return math.NaN()
	}
	return ds / dc * 1000
}

func (cp *controlPlane) scrape(ctx context.Context) (metrics, error) {
	l := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(cp.caFile), MinVersion: tls.VersionTLS12}}, Timeout: 30 * time.Second}
	return scrapeURL(ctx, l, cp.url+"/metrics", cp.token)
}

func mustPool(file string) *x509.CertPool {
	pool := x509.NewCertPool()
	if b, err := os.ReadFile(file); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	return pool
}

// scrapeURL reads the _sum and _count of the admission histograms, summed
// over every label but name (path for controller-runtime's).
func scrapeURL(ctx context.Context, c *http.Client, url, token string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("failed to scrape %s: HTTP %d", url, resp.StatusCode)
	}
	m := metrics{}
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if name, v, ok := strings.Cut(line, " "); ok && slices.Contains(runtimeGauges, name) {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				m[name] = [2]float64{f}
			}
			continue
		}
		for _, base := range []string{"apiserver_admission_webhook_admission_duration_seconds", "apiserver_admission_controller_admission_duration_seconds", "controller_runtime_webhook_latency_seconds"} {
			for i, suffix := range []string{"_sum{", "_count{"} {
				if !strings.HasPrefix(line, base+suffix) {
					continue
				}
				end := strings.LastIndexByte(line, '}')
				if end < 0 {
					continue
				}
				labels, value := line[len(base+suffix):end], strings.TrimSpace(line[end+1:])
				if base == "apiserver_admission_controller_admission_duration_seconds" && !strings.Contains(labels, `type="admit"`) {
					continue
				}
				name := label(labels, "name")
				if base == "controller_runtime_webhook_latency_seconds" {
					name = label(labels, "webhook")
				}
				f, err := strconv.ParseFloat(value, 64)
				if err != nil {
					continue
				}
				v := m[base+"|"+name]
				v[i] += f
				m[base+"|"+name] = v
			}
		}
	}
	return m, s.Err()
}

func label(labels, key string) string {
	i := strings.Index(labels, key+`="`)
	if i < 0 {
		return ""
	}
	rest := labels[i+len(key)+2:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return ""
}

// table is the run's result as Markdown.
func (r *run) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kube-apiserver %s on loopback, %d nodes (%d GPU nodes), %d measured dry-run creates per row after %d warm-up, %s\n", cluster.KubernetesVersion, r.o.nodes, gpuNodes(r.o.nodes, r.o.gpuFraction), r.o.requests, r.o.warmup, machine())
	switch {
	case r.o.defaultValues:
		b.WriteString("the chart rendered with its default values; its policy switched on by gpu-injector's elected replica\n")
	case r.o.runtimeDelivery:
		b.WriteString("the chart rendered with config.driverDelivery=Runtime\n")
	}
	b.WriteString("\n")
	b.WriteString("| admits the pod | pod | conc. | client p50 ms | client p99 ms | pods/s | API server: webhook mean ms | API server: mutating plugin mean ms | in gpu-injector ms |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.results {
		fmt.Fprintf(&b, "| %s | %s (%d KB) | %d | %.2f | %.2f | %.0f | %s | %s | %s |\n", variantTitles[x.variant], x.size, len(r.pods[x.size])/1024, x.concurrency,
			ms(x.p50), ms(x.p99), x.rate, num(x.webhookMean), num(x.pluginMean), num(x.handlerMean))
	}
	b.WriteString("\nRatios (gpu-injector / floor):\n\n")
	find := func(v, size string, c int) *result {
		for i := range r.results {
			x := &r.results[i]
			if x.variant == v && x.size == size && x.concurrency == c {
				return x
			}
		}
		return nil
	}
	for _, size := range r.o.sizes {
		ours, same, noop := find(variantOurs, size, 1), find(variantSamePatch, size, 1), find(variantNoop, size, 1)
		if pol := find(variantChartPolicy, size, 1); pol != nil && noop != nil {
			fmt.Fprintf(&b, "- %s, concurrency 1, API server's mutating-plugin mean: the chart's policy %.2fx the no-op floor\n", size, pol.pluginMean/noop.pluginMean)
		}
		if ours == nil {
			continue
		}
		if same != nil && noop != nil {
			fmt.Fprintf(&b, "- %s, concurrency 1, API server's webhook mean: %.2fx the same-patch floor, %.2fx the no-op floor\n", size, ours.webhookMean/same.webhookMean, ours.webhookMean/noop.webhookMean)
		}
		for _, c := range r.o.concurrency {
			o, n := find(variantOurs, size, c), find(variantNoop, size, c)
			if o != nil && n != nil && c > 1 {
				fmt.Fprintf(&b, "- %s, concurrency %d, client p50: %.2fx the no-op floor's\n", size, c, float64(o.p50)/float64(n.p50))
			}
		}
	}
	if r.rssIdleKiB > 0 {
		fmt.Fprintf(&b, "\ngpu-injector resident memory with %d nodes cached: %.1f MiB idle, %.1f MiB at most under load (high-water mark since start %.1f MiB)\n",
			r.o.nodes, float64(r.rssIdleKiB)/1024, float64(r.rssPeakKiB)/1024, float64(r.rssHWMKiB)/1024)
		fmt.Fprintf(&b, "idle: %.1f MiB anonymous (Go heap in use %.1f MiB) + %.1f MiB of mapped files (the binary)\n",
			float64(r.rssAnonKiB)/1024, r.heapIdleBytes/(1<<20), float64(r.rssFileKiB)/1024)
		// The binary's pages are resident as the kernel's page cache has
		// them (a binary just written is often resident whole): the
		// anonymous part is the process's own.
		fmt.Fprintf(&b, "at most under load: %.1f MiB anonymous + %.1f MiB of mapped files\n",
			float64(r.rssPeakAnonKiB)/1024, float64(r.rssPeakFileKiB)/1024)
		if g := r.peakGauges; g != nil {
			mib := func(k string) float64 { return g[k][0] / (1 << 20) }
			fmt.Fprintf(&b, "Go heap at that peak (read within %d MiB of it): %.1f MiB live at the last collection, goal %.1f MiB, %.1f MiB in use (%.1f MiB of it unused in spans), %.1f MiB free not yet returned\n",
				gaugeStepKiB/1024, mib(heapLive), mib(heapGoal), mib(heapInUse), mib(heapUnused), mib(heapFree))
		}
	}
	return b.String()
}

func num(f float64) string {
	if math.IsNaN(f) {
		return "-"
	}
	return fmt.Sprintf("%.2f", f)
}

func machine() string {
	n := 0
	model := ""
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "processor") {
				n++
			}
			if model == "" && strings.HasPrefix(l, "model name") {
				_, model, _ = strings.Cut(l, ":")
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s)", n, strings.TrimSpace(model))
}
