package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

const (
	namespace    = "loadtest"
	sizeLabelKey = workload.SizeLabel
	// sizeCPU is the small pod without its GPU limit.
	sizeCPU = "cpu"
)

// chartPolicy is a chart's admission policy, its binding and the webhook
// configuration rendered beside them.
type chartPolicy struct {
	policy  *admissionregistrationv1.MutatingAdmissionPolicy
	binding *admissionregistrationv1.MutatingAdmissionPolicyBinding
	mwc     *admissionregistrationv1.MutatingWebhookConfiguration
}

// switchName is the binding gpu-injector's elected replica opens where the
// chart renders it switched (closed), empty otherwise: the chart-policy
// variant creates the chart's binding under the variant's name.
func (p chartPolicy) switchName() string {
	if p.binding == nil || !gpunodes.PolicyBindingClosed(p.binding) {
		return ""
	}
	return variantChartPolicy
}

// run is one load run's state.
type run struct {
	o   *options
	dir string
	cp  *controlPlane
	cfg *config.Configuration
	mwc *admissionregistrationv1.MutatingWebhookConfiguration
	// chartPol is the chart's admission policy and the webhook configuration
	// rendered beside it (-runtime-delivery); refPol the same of -ref-chart.
	chartPol, refPol chartPolicy
	ca               []byte
	certDir          string
	pods             map[string][]byte // size -> the pod's JSON
	patches          map[string][]byte // size -> our JSON Patch for it
	// wholeLists makes the same change with each list we append to
	// replaced whole: 5 operations instead of 41.
	wholeListPatches map[string][]byte

	webhookURL     string
	webhookMetrics string
	webhookPprof   string
	webhookProc    *exec.Cmd
	noop, same     *floorWebhook
	wholeLists     *floorWebhook

	rssIdleKiB, rssPeakKiB, rssHWMKiB int64
	rssAnonKiB, rssFileKiB            int64
	rssPeakAnonKiB, rssPeakFileKiB    int64
	// peakGauges are the webhook's runtime gauges read at its resident
	// peak, when it was gaugedKiB.
	peakGauges    metrics
	gaugedKiB     int64
	heapIdleBytes float64
	results       []result
}

func newRun(ctx context.Context, o *options, dir string, cp *controlPlane) (*run, error) {
	r := &run{o: o, dir: dir, cp: cp, pods: map[string][]byte{}, patches: map[string][]byte{}, wholeListPatches: map[string][]byte{}}
	r.certDir = filepath.Join(dir, "webhook-certs")
	var err error
	if r.ca, err = cluster.ServingCerts(r.certDir, "127.0.0.1", "localhost"); err != nil {
		return r, err
	}
	if err := r.chart(ctx); err != nil {
		return r, err
	}
	if err := r.namespaces(ctx); err != nil {
		return r, err
	}
	if err := r.createNodes(ctx, 0, o.nodes); err != nil {
		return r, err
	}
	if err := r.ourPatches(); err != nil {
		return r, err
	}
	if err := r.startWebhook(ctx); err != nil {
		return r, err
	}
	if r.noop, err = startFloor(filepath.Join(r.certDir, "tls.crt"), filepath.Join(r.certDir, "tls.key"), nil); err != nil {
		return r, err
	}
	if r.same, err = startFloor(filepath.Join(r.certDir, "tls.crt"), filepath.Join(r.certDir, "tls.key"), r.patches); err != nil {
		return r, err
	}
	if r.wholeLists, err = startFloor(filepath.Join(r.certDir, "tls.crt"), filepath.Join(r.certDir, "tls.key"), r.wholeListPatches); err != nil {
		return r, err
	}
	return r, nil
}

func (r *run) close() {
	if r.webhookProc != nil {
		stopProcess(r.webhookProc)
	}
	if r.noop != nil {
		r.noop.close()
	}
	if r.same != nil {
		r.same.close()
	}
	if r.wholeLists != nil {
		r.wholeLists.close()
	}
}

// chart takes the chart's webhook configuration and configuration file, as
// helm template renders them.
func (r *run) chart(ctx context.Context) error {
	var objs []*unstructured.Unstructured
	if r.o.chartObjects != "" {
		data, err := os.ReadFile(r.o.chartObjects)
		if err != nil {
			return err
		}
		if objs, err = decodeYAMLObjects(data); err != nil {
			return err
		}
	} else {
		helm := filepath.Join(r.o.cacheDir, "helm-"+cluster.HelmVersion, "helm")
		if _, err := os.Stat(helm); err != nil {
			return fmt.Errorf("%s is missing: run hack/tools.sh all, or pass -chart-objects", helm)
		}
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		// The URL and caBundle are set below; the chart decides the rest.
		sets := []string{"webhook.enabled=false", "webhook.url=https://127.0.0.1:1"}
		if r.o.chartPolicies() {
			if r.o.runtimeDelivery {
				sets = append(sets, "config.driverDelivery=Runtime")
			}
			if r.chartPol, err = renderPolicy(ctx, wd, helm, sets); err != nil {
				return err
			}
			if r.o.refChart != "" {
				if r.refPol, err = renderPolicy(ctx, r.o.refChart, helm, sets); err != nil {
					return fmt.Errorf("-ref-chart: %w", err)
				}
			}
			sets = append(sets, "admission.policy=off")
		}
		if objs, err = env.RenderChart(ctx, wd, helm, sets...); err != nil {
			return err
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			r.mwc = &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, r.mwc); err != nil {
				return fmt.Errorf("failed to read the chart's webhook configuration: %w", err)
			}
		case "ConfigMap":
			if data, _, _ := unstructured.NestedString(o.Object, "data", "config.yaml"); data != "" {
				file := filepath.Join(r.dir, "config.yaml")
				if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
					return err
				}
				cfg, err := config.Load(file)
				if err != nil {
					return err
				}
				r.cfg = cfg
			}
		}
	}
	if r.mwc == nil || len(r.mwc.Webhooks) != 1 || r.cfg == nil {
		return errors.New("the rendered chart lacks the webhook configuration (one webhook) or the ConfigMap with config.yaml")
	}
	return nil
}

// renderPolicy renders the chart of the checkout at root and takes its
// admission policy and the webhook configuration rendered with it.
func renderPolicy(ctx context.Context, root, helm string, sets []string) (chartPolicy, error) {
	var pol chartPolicy
	objs, err := env.RenderChart(ctx, root, helm, sets...)
	if err != nil {
		return pol, err
	}
	for _, o := range objs {
		var err error
		switch o.GetKind() {
		case "MutatingAdmissionPolicy":
			pol.policy = &admissionregistrationv1.MutatingAdmissionPolicy{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, pol.policy)
		case "MutatingAdmissionPolicyBinding":
			pol.binding = &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, pol.binding)
		case "MutatingWebhookConfiguration":
			pol.mwc = &admissionregistrationv1.MutatingWebhookConfiguration{}
			err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, pol.mwc)
		}
		if err != nil {
			return pol, fmt.Errorf("failed to read the chart's %s: %w", o.GetKind(), err)
		}
	}
	if pol.policy == nil || pol.binding == nil || pol.mwc == nil {
		return pol, fmt.Errorf("the chart rendered with %v lacks its MutatingAdmissionPolicy, its binding or its webhook configuration", sets)
	}
	return pol, nil
}

func (r *run) namespaces(ctx context.Context) error {
	cs := r.cp.client
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: env.Namespace}},
		{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{layout.LabelInject: layout.InjectEnabled}}},
	} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("failed to create namespace %s: %w", ns.Name, err)
		}
	}
	// No controller manager makes it; the ServiceAccount admission needs it.
	_, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	return err
}

// createNodes registers nodes from..to-1 (clusterNode) as kubelets would: created with the
// not-ready taint, then Ready through the status subresource, then the taint
// lifted as the node lifecycle controller would.
func (r *run) createNodes(ctx context.Context, from, to int) error {
	start := time.Now()
	progress("creating nodes %d to %d, %d of them GPU nodes", from, to-1, gpuNodes(to, r.o.gpuFraction)-gpuNodes(from, r.o.gpuFraction))
	// Without the client's rate limit (the control plane's client allows
	// 1,000 requests/s: 65,000 nodes would take over three minutes at it);
	// -node-workers bounds the requests in flight.
	cfg := rest.CopyConfig(r.cp.rest)
	cfg.QPS, cfg.Burst = -1, 0
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to create the node client: %w", err)
	}
	cs := client.CoreV1().Nodes()
	var done atomic.Int64
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, r.o.nodeWorkers)
	lift := []byte(`{"spec":{"taints":null}}`)
	for range r.o.nodeWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				node, status, keep := r.clusterNode(i)
				n, err := cs.Create(ctx, node, metav1.CreateOptions{})
				if err == nil {
					n.Status = status
					n, err = cs.UpdateStatus(ctx, n, metav1.UpdateOptions{})
				}
				if err == nil {
					patch := lift
					if len(keep) > 0 {
						b, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": keep}})
						patch = b
					}
					_, err = cs.Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{})
				}
				if err != nil {
					errs <- fmt.Errorf("failed to register node %d: %w", i, err)
					return
				}
				if d := done.Add(1); d%5000 == 0 && d < int64(to-from) {
					progress("%d nodes", int64(from)+d)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	d := time.Since(start)
	progress("%d nodes in %s (%.0f nodes/s)", to-from, d.Round(time.Second), float64(to-from)/d.Seconds())
	return nil
}

// withPlugin labels a node as one whose NRI plugin is registered, with -nri.
func (r *run) withPlugin(n *corev1.Node) *corev1.Node {
	if r.o.nri {
		n.Labels[layout.LabelNRIPlugin] = layout.NRIProtocol
	}
	return n
}

// ourPatches computes, offline, the patch the webhook gives each pod: the
// same-patch floor answers with it and the admission policy applies it.
func (r *run) ourPatches() error {
	idx := gpunodes.NewIndex(r.cfg, logr.Discard())
	for k := range gpuNodes(r.o.nodes, r.o.gpuFraction) {
		idx.Add(r.withPlugin(workload.ReadyNode(k)))
	}
	for _, s := range workload.Sizes {
		if !contains(r.o.sizes, s.Name) {
			continue
		}
		pod := workload.Pod(s.Name, s.Bytes)
		raw, err := json.Marshal(pod)
		if err != nil {
			return err
		}
		r.pods[s.Name] = raw
		p := pod.DeepCopy()
		p.Namespace = namespace
		res := inject.Mutate(inject.Input{Pod: p, Layouts: idx.Layouts()}, r.cfg)
		if res.Decision != inject.DecisionInjected {
			return fmt.Errorf("the %s pod is not injected offline: %s %s", s.Name, res.Decision, res.Reason)
		}
		if r.patches[s.Name], err = json.Marshal(res.Patch); err != nil {
			return err
		}
		whole, n, err := wholeLists(raw, res.Patch)
		if err != nil {
			return fmt.Errorf("failed to make the %s pod's whole-list patch: %w", s.Name, err)
		}
		r.wholeListPatches[s.Name] = whole
		progress("%s pod: %d bytes, our patch %d operations, %d bytes (whole lists: %d operations, %d bytes)", s.Name, len(raw), len(res.Patch), len(r.patches[s.Name]), n, len(whole))
	}
	if contains(r.o.sizes, sizeCPU) {
		pod := workload.Pod(sizeCPU, workload.Sizes[0].Bytes)
		delete(pod.Spec.Containers[0].Resources.Limits, "nvidia.com/gpu")
		raw, err := json.Marshal(pod)
		if err != nil {
			return err
		}
		r.pods[sizeCPU] = raw
		progress("%s pod: %d bytes, no GPU", sizeCPU, len(raw))
	}
	return nil
}

func (r *run) startWebhook(ctx context.Context) error {
	readyIn, err := r.launchWebhook(ctx, "webhook", nil)
	if err != nil {
		return err
	}
	progress("webhook ready in %s with %d nodes cached", readyIn.Round(time.Millisecond), r.o.nodes)
	// Idle: after the initial list, once the garbage of decoding it is gone
	// (the Go runtime returns freed memory to the OS over minutes, so this
	// forces nothing and waits a little).
	time.Sleep(5 * time.Second)
	if m, err := procMemory(r.webhookProc.Process.Pid); err == nil {
		r.rssIdleKiB, r.rssAnonKiB, r.rssFileKiB = m.rss, m.anon, m.file
	}
	if m, err := scrapeURL(ctx, http.DefaultClient, r.webhookMetrics, ""); err == nil {
		r.heapIdleBytes = m[heapInUse][0]
	}
	if r.webhookPprof != "" {
		// What the idle webhook keeps: go tool pprof -sample_index=inuse_space.
		file := filepath.Join(r.o.profileDir, "gpu-injector-heap-idle.pprof")
		if err := fetchToFile(ctx, strings.TrimSuffix(r.webhookPprof, "/profile")+"/heap", file); err != nil {
			return err
		}
		progress("heap profile of the idle webhook: %s", file)
	}
	return nil
}

// webhookBinary is -gpu-injector, or a binary built as the image's is.
func (r *run) webhookBinary(ctx context.Context) (string, error) {
	if r.o.binary != "" {
		return r.o.binary, nil
	}
	bin := filepath.Join(r.dir, "gpu-injector")
	progress("building gpu-injector as the image does (go build -trimpath -ldflags '-s -w')")
	// Stripped as in the image: the binary's mapped pages are part of
	// the resident memory the table reports.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("failed to build gpu-injector: %w", err)
	}
	r.o.binary = bin
	return bin, nil
}

// launchWebhook starts gpu-injector webhook, its log in name.log and environ
// (nil: this process's) its environment, and waits until it is ready: until
// it has listed every Node. It returns how long that took.
func (r *run) launchWebhook(ctx context.Context, name string, environ []string) (time.Duration, error) {
	bin, err := r.webhookBinary(ctx)
	if err != nil {
		return 0, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return 0, err
	}
	r.webhookURL = fmt.Sprintf("https://127.0.0.1:%d/mutate-v1-pod", ports[0])
	r.webhookMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[2])
	args := []string{"webhook",
		"--cert-mode=external", "--cert-dir=" + r.certDir,
		fmt.Sprintf("--port=%d", ports[0]),
		"--config=" + filepath.Join(r.dir, "config.yaml"),
		"--kubeconfig=" + r.cp.kubeconfig,
		"--namespace=" + env.Namespace,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[1]),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[2]),
		// Nothing routes requests to it when it stops.
		"--shutdown-delay=0s",
	}
	if sw := r.chartPol.switchName(); sw != "" {
		// As the chart's Deployment runs it: its elected replica keeps the
		// binding open while every node takes the driver at the runtime.
		args = append(args, "--policy-binding-name="+sw)
	}
	if r.o.profileDir != "" {
		r.webhookPprof = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile", ports[3])
		args = append(args, fmt.Sprintf("--pprof-bind-address=127.0.0.1:%d", ports[3]))
	}
	if r.webhookProc, err = startProcessEnv(r.dir, name, bin, environ, args...); err != nil {
		return 0, err
	}
	log := filepath.Join(r.dir, name+".log")
	start := time.Now()
	for {
		resp, err := httpGet(ctx, http.DefaultClient, ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		if exited(r.webhookProc.Process.Pid) {
			return 0, fmt.Errorf("the webhook exited before it was ready; see %s", log)
		}
		if time.Since(start) > r.o.readyTimeout {
			return 0, fmt.Errorf("%w after %s; see %s", errNotReady, r.o.readyTimeout, log)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// errNotReady: the webhook did not turn ready within -ready-timeout.
var errNotReady = errors.New("the webhook is not ready")

// exited says whether a child process has ended (a zombie until waited for).
func exited(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces, the state follows its ")".
	_, rest, _ := strings.Cut(string(data), ") ")
	return strings.HasPrefix(rest, "Z") || strings.HasPrefix(rest, "X")
}

// fetchToFile writes the body of an HTTP GET to file.
func fetchToFile(ctx context.Context, url, file string) error {
	resp, err := httpGet(ctx, http.DefaultClient, url)
	if err != nil {
		return fmt.Errorf("failed to get %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	if err != nil {
		return fmt.Errorf("failed to get %s: %w", url, err)
	}
	return os.WriteFile(file, data, 0o644)
}

// memory is a process's resident set from /proc, in KiB.
type memory struct{ rss, hwm, anon, file int64 }

// procMemory reads a process's resident set (now), its high-water mark and
// the anonymous and file-backed parts of it.
func procMemory(pid int) (memory, error) {
	var m memory
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	fields := map[string]*int64{"VmRSS:": &m.rss, "VmHWM:": &m.hwm, "RssAnon:": &m.anon, "RssFile:": &m.file}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[2] == "kB" && fields[f[0]] != nil {
			*fields[f[0]], _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	return m, nil
}

func webhookFor(base *admissionregistrationv1.MutatingWebhookConfiguration, name, url string, ca []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	m := base.DeepCopy()
	m.ObjectMeta = metav1.ObjectMeta{Name: name}
	m.Webhooks[0].Name = name + ".loadtest.gpu-injector.io"
	m.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca}
	return m
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
