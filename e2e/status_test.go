//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/env"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

// gpuInjectorStatus runs `gpu-injector status` as a user does, with the
// admin kubeconfig, and returns its output and exit status.
func gpuInjectorStatus(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return gpuInjector(t, append([]string{"status", "--kubeconfig", testEnv.Kubeconfig}, args...)...)
}

// statusReport is `gpu-injector status -o json`'s report and exit status.
func statusReport(t *testing.T, args ...string) (*status.Report, int) {
	t.Helper()
	return jsonReport[status.Report](t, append([]string{"status", "--kubeconfig", testEnv.Kubeconfig}, args...)...)
}

// TestStatus: `gpu-injector status` shows an operator, against the real
// cluster, the webhook (and that the API server reaches it, by a dry-run GPU
// pod the webhook injects), the probes, every GPU node, the pools, the
// opted-in namespaces and recent layout mismatches; it flags a namespace
// whose Pod Security level refuses the injected hostPath, and a webhook
// scaled to zero, with exit status 3.
func TestStatus(t *testing.T) {
	ns := newNamespace(t, true)

	t.Run("every section", func(t *testing.T) {
		out, errOut, code := gpuInjectorStatus(t, "--dry-run-namespace", ns)
		t.Logf("gpu-injector status (exit %d):\n%s", code, out)
		// Other tests share the cluster and may have left, for example, a
		// LayoutMismatch Event of the last hour: 3 is allowed, 1 is not.
		if code != status.ExitOK && code != status.ExitAttention {
			t.Fatalf("exit %d; stderr:\n%s", code, errOut)
		}
		want := []string{"WEBHOOK", env.Namespace + "/" + env.WebhookDeployment, "ready", "CA bundle set",
			"in " + ns + ": the API server reaches the webhook, which injected layout",
			"nodeSelector " + layout.LabelFingerprint + "=",
			"PROBE", "GPU NODES", "POOLS", "OPTED-IN NAMESPACES", ns, "LAYOUT MISMATCH EVENTS (last hour)"}
		for _, n := range testEnv.Nodes {
			want = append(want, n.Name)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q", w)
			}
		}
		if strings.Contains(out, "\x1b[") {
			t.Errorf("colour on a pipe:\n%q", out)
		}

		r, _ := statusReport(t, "--dry-run-namespace", ns)
		if r.Webhook.Ready == 0 || r.Webhook.Ready != r.Webhook.Desired {
			t.Errorf("webhook %d/%d ready, want all", r.Webhook.Ready, r.Webhook.Desired)
		}
		if d := r.Webhook.DryRun; d.Outcome != status.DryRunInjected || d.Fingerprint == "" || len(d.HostPaths) == 0 {
			t.Errorf("dry run %+v, want an injected layout with hostPaths", d)
		}
		if r.Probe.DaemonSet == "" || r.Probe.Ready != r.Probe.Desired {
			t.Errorf("probe %+v, want every pod ready", r.Probe)
		}
		nodes := map[string]status.NodeStatus{}
		for _, n := range r.Nodes {
			nodes[n.Name] = n
		}
		for _, n := range testEnv.Nodes {
			got, ok := nodes[n.Name]
			switch {
			case !ok:
				t.Errorf("GPU node %s is not listed", n.Name)
			case got.State == "" || got.Fingerprint == "" && got.State == layout.StateReady:
				t.Errorf("node %s: %+v, want its probe's state and fingerprint", n.Name, got)
			}
		}
	})

	t.Run("a baseline namespace is flagged", func(t *testing.T) {
		baseline := newNamespace(t, true)
		patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"baseline"}}}`
		if _, err := client().CoreV1().Namespaces().Patch(testContext(t), baseline, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("failed to label %s baseline: %v", baseline, err)
		}
		r, code := statusReport(t, "--dry-run-namespace", ns)
		if code != status.ExitAttention {
			t.Errorf("exit %d, want %d", code, status.ExitAttention)
		}
		var found bool
		for _, n := range r.Namespaces {
			if n.Name == baseline {
				found = true
				if n.Enforce != "baseline" || !strings.Contains(n.Refused, "GPU pods will be refused") {
					t.Errorf("namespace %+v, want it flagged", n)
				}
			}
		}
		if !found {
			t.Fatalf("namespace %s is not listed: %+v", baseline, r.Namespaces)
		}
		if !strings.Contains(strings.Join(r.Attention, "\n"), "namespace "+baseline+" enforces Pod Security \"baseline\"") {
			t.Errorf("attention does not name %s: %v", baseline, r.Attention)
		}
		// The flag is true: the API server refuses the injected pod there.
		dr, _ := statusReport(t, "--dry-run-namespace", baseline)
		if dr.Webhook.DryRun.Outcome != status.DryRunDenied || !strings.Contains(dr.Webhook.DryRun.Message, "hostPath") {
			t.Errorf("dry run in %s: %+v, want Pod Security's hostPath refusal", baseline, dr.Webhook.DryRun)
		}
	})

	t.Run("webhook scaled to zero", func(t *testing.T) {
		if err := testEnv.StopWebhook(); err != nil {
			t.Fatalf("failed to stop the webhook: %v", err)
		}
		t.Cleanup(func() {
			if err := testEnv.StartWebhook(context.Background()); err != nil {
				t.Errorf("failed to restart the webhook: %v", err)
			}
		})
		out, errOut, code := gpuInjectorStatus(t, "--dry-run-namespace", ns)
		t.Logf("gpu-injector status (exit %d):\n%s", code, out)
		if code != status.ExitAttention {
			t.Errorf("exit %d, want %d; stderr:\n%s", code, status.ExitAttention, errOut)
		}
		for _, w := range []string{"0/0 ready", "the API server CANNOT REACH the webhook", "NEEDS ATTENTION", "has 0 ready replicas"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q", w)
			}
		}
	})
}

// TestStatusPrometheus runs a real Prometheus (Debian's package, or
// $PROMETHEUS) against the cluster, scraping what the chart's ServiceMonitor
// and PodMonitor would (the webhook replicas, the kubelet node's probe pod,
// with the namespace and node labels prometheus-operator adds) and the API
// server, with the chart's PrometheusRule loaded. Every query of the
// dashboard runs on Prometheus's own engine and those of a working cluster
// return data; every rule evaluates without error and none is active on a
// healthy cluster; with the webhook stopped, GPUInjectorWebhookDown and
// GPUInjectorWebhookCallsFailing turn pending.
func TestStatusPrometheus(t *testing.T) {
	bin := os.Getenv("PROMETHEUS")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("prometheus"); err != nil {
			t.Skip("no prometheus on PATH and $PROMETHEUS unset (hack/prometheus-e2e.sh installs Debian's)")
		}
	}
	ctx := testContext(t)
	dir := t.TempDir()

	// The chart's rule groups, as the PrometheusRule carries them.
	cmd := exec.CommandContext(ctx, testEnv.Helm, "template", env.Release, filepath.Join(testEnv.RepoRoot, "charts", "gpu-injector"),
		"--namespace", env.Namespace, "--kube-version", strings.TrimPrefix(cluster.KubernetesVersion, "v"),
		"--api-versions", "monitoring.coreos.com/v1/PrometheusRule", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
		"--api-versions", "monitoring.coreos.com/v1/PodMonitor",
		"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
		"--show-only", "templates/prometheusrule.yaml")
	rendered, err := cmd.Output()
	if err != nil {
		t.Fatalf("failed to render the PrometheusRule: %v", err)
	}
	var rule struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(rendered, &rule); err != nil {
		t.Fatalf("failed to decode the PrometheusRule: %v", err)
	}
	writeYAML(t, filepath.Join(dir, "rules.yaml"), rule.Spec)

	// What the ServiceMonitor and the PodMonitor would scrape, with the labels
	// prometheus-operator gives those targets.
	webhookURLs, err := testEnv.WebhookMetricsURLs(ctx)
	if err != nil || len(webhookURLs) == 0 {
		t.Fatalf("no webhook metrics endpoint (%v)", err)
	}
	var webhookTargets []string
	for _, u := range webhookURLs {
		webhookTargets = append(webhookTargets, strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/metrics"))
	}
	probe, err := testEnv.ProbePod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rc := testEnv.RESTConfig()
	apiserver := strings.TrimPrefix(testEnv.Cluster.APIServerURL, "https://")
	config := map[string]any{
		"global":     map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
		"rule_files": []string{filepath.Join(dir, "rules.yaml")},
		"scrape_configs": []map[string]any{
			{"job_name": env.WebhookDeployment + "-metrics", "static_configs": []map[string]any{{"targets": webhookTargets, "labels": map[string]string{"namespace": env.Namespace}}}},
			{"job_name": env.Namespace + "/" + env.Release + "-nodeprobe", "static_configs": []map[string]any{{"targets": []string{probe.Status.PodIP + ":8083"},
				"labels": map[string]string{"namespace": env.Namespace, "node": probe.Spec.NodeName}}}},
			{"job_name": "apiserver", "scheme": "https", "static_configs": []map[string]any{{"targets": []string{apiserver}}},
				"tls_config": map[string]string{"ca_file": rc.TLSClientConfig.CAFile, "cert_file": rc.TLSClientConfig.CertFile, "key_file": rc.TLSClientConfig.KeyFile}},
		},
	}
	writeYAML(t, filepath.Join(dir, "prometheus.yml"), config)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	prom := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	prom.Stdout, prom.Stderr = logFile, logFile
	if err := prom.Start(); err != nil {
		t.Fatalf("failed to start %s: %v", bin, err)
	}
	promStart := time.Now()
	t.Cleanup(func() {
		_ = prom.Process.Kill()
		_ = prom.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	base := "http://" + addr

	// Admissions to count: dry runs reach the webhook and store nothing.
	ns := newNamespace(t, true)
	dryRunGPUPods := func(n int) {
		for i := 0; i < n; i++ {
			_, _ = client().CoreV1().Pods(ns).Create(ctx, gpuPod(fmt.Sprintf("prometheus-%d", i), podOpts{resource: gpu}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		}
	}
	dryRunGPUPods(5)
	waitFor(t, runTimeout, "Prometheus to scrape the webhooks, the probe and the API server's webhook metrics", func(ctx context.Context) (bool, error) {
		dryRunGPUPods(1)
		up, _ := promQuery(ctx, base, `count(up == 1)`)
		calls, _ := promQuery(ctx, base, `sum(rate(apiserver_admission_webhook_request_total{name="pods.gpu-injector.io"}[1m]))`)
		injected, _ := promQuery(ctx, base, `sum(rate(gpu_injector_pods_injected_total[1m])) > 0`)
		return len(up) == 1 && up[0].value() == float64(len(webhookTargets)+2) && len(calls) > 0 && len(injected) > 0, nil
	})
	// A probe runs every 5 minutes: one now, after Prometheus has its counters
	// from before, so that the probe's panels have something to show.
	if err := testEnv.ProbeNow(ctx, probe.Spec.NodeName); err != nil {
		t.Fatalf("failed to make the probe probe: %v", err)
	}
	waitFor(t, runTimeout, "Prometheus to see the probe's new probe", func(ctx context.Context) (bool, error) {
		probed, _ := promQuery(ctx, base, `increase(gpu_injector_probe_duration_seconds_count[15m]) > 0`)
		scraped, _ := promQuery(ctx, base, `count_over_time(gpu_injector_probe_node_writes_total[1m]) >= 2`)
		return len(probed) > 0 && len(scraped) > 0, nil
	})

	if dataDir := os.Getenv("GPU_INJECTOR_DASHBOARD_DATA"); dataDir != "" {
		t.Run("dashboard data", func(t *testing.T) {
			writeDashboardData(t, base, ns, promStart, dataDir)
		})
		// The load above took minutes of the test's context.
		ctx = testContext(t)
	}

	t.Run("every dashboard query runs; those of a working cluster have data", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(testEnv.RepoRoot, "charts", "gpu-injector", "files", "dashboard.json"))
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		// Series a working cluster without pools, denials or probe errors
		// lacks: those queries must run, not answer.
		mayBeEmpty := regexp.MustCompile(`gpu_injector_pools|gpu_injector_probe_errors_total|rejection_count|fail_open_count|gpu_injector_pods_denied_total`)
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				q := dashboardVars.Replace(tg.Expr)
				res, err := promQuery(ctx, base, q)
				switch {
				case err != nil:
					t.Errorf("panel %q: %s: %v", p.Title, q, err)
				case len(res) == 0 && !mayBeEmpty.MatchString(q):
					t.Errorf("panel %q: %s: no data", p.Title, q)
				default:
					t.Logf("panel %q: %s: %d series", p.Title, q, len(res))
				}
			}
		}
	})

	t.Run("every rule evaluates; none is active on a healthy cluster", func(t *testing.T) {
		waitFor(t, apiTimeout, "every rule to be evaluated without error", func(ctx context.Context) (bool, error) {
			rules, err := promRules(ctx, base)
			if err != nil || len(rules) < 10 {
				return false, nil
			}
			for _, r := range rules {
				if r.Health != "ok" {
					if r.LastError != "" {
						return false, fmt.Errorf("rule %s: %s", r.Name, r.LastError)
					}
					return false, nil
				}
			}
			return true, nil
		})
		rules, _ := promRules(ctx, base)
		for _, r := range rules {
			if r.State != "inactive" {
				t.Errorf("alert %s is %s on a healthy cluster: %v", r.Name, r.State, r.Alerts)
			}
		}
	})

	t.Run("webhook stopped: down and failing calls", func(t *testing.T) {
		if err := testEnv.StopWebhook(); err != nil {
			t.Fatalf("failed to stop the webhook: %v", err)
		}
		t.Cleanup(func() {
			if err := testEnv.StartWebhook(context.Background()); err != nil {
				t.Errorf("failed to restart the webhook: %v", err)
			}
		})
		want := map[string]bool{"GPUInjectorWebhookDown": true, "GPUInjectorWebhookCallsFailing": true}
		waitFor(t, runTimeout, "GPUInjectorWebhookDown and GPUInjectorWebhookCallsFailing to be pending", func(ctx context.Context) (bool, error) {
			dryRunGPUPods(1)
			rules, err := promRules(ctx, base)
			if err != nil {
				return false, nil
			}
			active := 0
			for _, r := range rules {
				if want[r.Name] && r.State != "inactive" {
					active++
				}
			}
			return active == len(want), nil
		})
	})
}

// dashboardVars stands for the dashboard's Grafana variables.
var dashboardVars = strings.NewReplacer("$__rate_interval", "1m", "$__range", "5m", "$namespace", env.Namespace)

// writeDashboardData keeps admissions going until Prometheus holds at least
// three minutes of samples and a probe has run in them (the probes run every
// 5 minutes, and their duration panel shows nothing in between), then writes,
// for every panel of the dashboard, each target's range query over that
// window into dir as one JSON file: what hack/dashboard-plot.sh draws, since
// Grafana itself cannot run here.
func writeDashboardData(t *testing.T, base, ns string, start time.Time, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	const window, most, step = 3 * time.Minute, 8 * time.Minute, 5 * time.Second
	probes := func() float64 {
		res, _ := promQuery(ctx, base, `sum(gpu_injector_probe_duration_seconds_count)`)
		if len(res) == 0 {
			return 0
		}
		return res[0].value()
	}
	first, probed := probes(), time.Time{}
	for i := 0; time.Since(start) < most; i++ {
		_, _ = client().CoreV1().Pods(ns).Create(ctx, gpuPod(fmt.Sprintf("dashboard-%d", i), podOpts{resource: gpu}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if probed.IsZero() && probes() > first {
			probed = time.Now()
		}
		// A minute after the probe, for the panels' 1m rates to show it.
		if time.Since(start) >= window && !probed.IsZero() && time.Since(probed) > 75*time.Second {
			break
		}
		time.Sleep(time.Second)
	}
	if probed.IsZero() {
		t.Logf("no probe ran in the %s window: the probe duration panel has no value", most)
	}
	end := time.Now()

	b, err := os.ReadFile(filepath.Join(testEnv.RepoRoot, "charts", "gpu-injector", "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			ID          int    `json:"id"`
			Title       string `json:"title"`
			Type        string `json:"type"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr         string          `json:"expr"`
		Query        string          `json:"query"`
		LegendFormat string          `json:"legendFormat"`
		Result       json.RawMessage `json:"result"`
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			continue // a row
		}
		out := struct {
			ID      int      `json:"id"`
			Title   string   `json:"title"`
			Type    string   `json:"type"`
			Unit    string   `json:"unit,omitempty"`
			Start   int64    `json:"start"`
			End     int64    `json:"end"`
			Step    int      `json:"step"`
			Targets []target `json:"targets"`
		}{ID: p.ID, Title: p.Title, Type: p.Type, Unit: p.FieldConfig.Defaults.Unit, Start: start.Unix(), End: end.Unix(), Step: int(step.Seconds())}
		for _, tg := range p.Targets {
			q := dashboardVars.Replace(tg.Expr)
			var resp struct {
				Status string `json:"status"`
				Error  string `json:"error"`
				Data   struct {
					Result json.RawMessage `json:"result"`
				} `json:"data"`
			}
			u := fmt.Sprintf("%s/api/v1/query_range?query=%s&start=%d&end=%d&step=%d", base, url.QueryEscape(q), out.Start, out.End, out.Step)
			if err := promGet(ctx, u, &resp); err != nil || resp.Status != "success" {
				t.Fatalf("panel %q: %s: %v %s", p.Title, q, err, resp.Error)
			}
			out.Targets = append(out.Targets, target{Expr: tg.Expr, Query: q, LegendFormat: tg.LegendFormat, Result: resp.Data.Result})
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, fmt.Sprintf("panel-%02d.json", p.ID))
		if err := os.WriteFile(name, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("panel %q: wrote %s", p.Title, name)
	}
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

func (s promSample) value() float64 {
	if len(s.Value) != 2 {
		return 0
	}
	str, _ := s.Value[1].(string)
	f, _ := strconv.ParseFloat(str, 64)
	return f
}

// promQuery runs an instant query through Prometheus's HTTP API.
func promQuery(ctx context.Context, base, query string) ([]promSample, error) {
	var resp struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := promGet(ctx, base+"/api/v1/query?query="+url.QueryEscape(query), &resp); err != nil {
		return nil, err
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("failed to run the query: %s", resp.Error)
	}
	return resp.Data.Result, nil
}

type promRule struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	Alerts    []any  `json:"alerts"`
}

// promRules are the loaded alerting rules and their state.
func promRules(ctx context.Context, base string) ([]promRule, error) {
	var resp struct {
		Data struct {
			Groups []struct {
				Rules []promRule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := promGet(ctx, base+"/api/v1/rules?type=alert", &resp); err != nil {
		return nil, err
	}
	var out []promRule
	for _, g := range resp.Data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

func promGet(ctx context.Context, u string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("failed to ask Prometheus: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("failed to read Prometheus's answer: %w", err)
	}
	return nil
}
