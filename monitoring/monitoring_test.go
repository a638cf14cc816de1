package monitoring

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

const (
	dashboardFile = "../charts/gpu-injector/files/dashboard.json"
	rulesFile     = "../charts/gpu-injector/templates/prometheusrule.yaml"
	runbookFile   = "../docs/troubleshooting.md"
)

// apiServerMetrics are the kube-apiserver's admission webhook metrics the
// dashboard and the alerts read (k8s.io/apiserver/pkg/admission/metrics),
// and up, Prometheus's own per target.
var apiServerMetrics = map[string]bool{
	"apiserver_admission_webhook_admission_duration_seconds": true,
	"apiserver_admission_webhook_request_total":              true,
	"apiserver_admission_webhook_rejection_count":            true,
	"apiserver_admission_webhook_fail_open_count":            true,
	"up": true,
}

// codeMetrics are the metric names the code registers: every `Name:
// "gpu_injector_..."` of a prometheus options literal in webhook/,
// nodeprobe/ and nriplugin/, read from the source so that a renamed metric fails here.
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, dir := range []string{"../webhook", "../nodeprobe", "../nriplugin"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				kv, ok := n.(*ast.KeyValueExpr)
				if !ok {
					return true
				}
				key, ok := kv.Key.(*ast.Ident)
				lit, isLit := kv.Value.(*ast.BasicLit)
				if ok && isLit && key.Name == "Name" && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(s, "gpu_injector_") {
						names[s] = true
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatalf("failed to read the metrics of %s: %v", dir, err)
		}
	}
	for _, want := range []string{"gpu_injector_pods_denied_total", "gpu_injector_layouts", "gpu_injector_probe_errors_total"} {
		if !names[want] {
			t.Fatalf("found metrics %v, without %s: the source scan is broken", sorted(names), want)
		}
	}
	return names
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	quoted     = regexp.MustCompile(`"(\\.|[^"\\])*"`)
	variable   = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
	identifier = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// metricLike are the names that are metrics here; PromQL's functions and
	// keywords and the label names have none of these prefixes.
	metricLike = regexp.MustCompile(`^(gpu_injector_|apiserver_|controller_runtime_|up$)`)
)

// metricsOf are the metric names a PromQL expression reads, with a
// histogram's _bucket, _sum and _count suffix taken off.
func metricsOf(expr string) []string {
	expr = variable.ReplaceAllString(quoted.ReplaceAllString(expr, `""`), "")
	var out []string
	for _, id := range identifier.FindAllString(expr, -1) {
		if !metricLike.MatchString(id) {
			continue
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(id, suffix); ok && (strings.HasSuffix(base, "_seconds") || strings.HasSuffix(base, "_bytes")) {
				id = base
			}
		}
		out = append(out, id)
	}
	return out
}

func checkMetrics(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	found := metricsOf(expr)
	if len(found) == 0 {
		t.Errorf("%s: %q reads no known metric", where, expr)
	}
	for _, m := range found {
		if !known[m] && !apiServerMetrics[m] {
			t.Errorf("%s: metric %s is neither defined in webhook/, nodeprobe/ or nriplugin/ nor an API server metric", where, m)
		}
	}
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource json.RawMessage          `json:"datasource"`
	GridPos    struct{ X, Y, W, H int } `json:"gridPos"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

// templatedDatasource is the only datasource a panel or query may name: the
// dashboard's variable, so that it works whatever the data source is called.
const templatedDatasource = "${datasource}"

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("failed to decode %s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed for a provisioned dashboard", d.UID, d.Title)
	}
	hasVar := false
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && string(v.Query) == `"prometheus"` {
			hasVar = true
		}
	}
	if !hasVar {
		t.Errorf("no templating variable datasource of type datasource for prometheus")
	}
	known := codeMetrics(t)
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d is missing or also %q's", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if p.Title == "" || p.GridPos.W <= 0 || p.GridPos.H <= 0 {
				t.Errorf("panel %d: title %q, gridPos %+v", p.ID, p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				// A row only groups panels: a query there is a mistake
				// Grafana silently ignores.
				if len(p.Targets) > 0 {
					t.Errorf("row %q has queries", p.Title)
				}
				continue
			}
			checkDatasource(t, "panel "+p.Title, p.Datasource)
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				where := "panel " + p.Title + " query " + tg.RefID
				checkDatasource(t, where, tg.Datasource)
				checkMetrics(t, where, tg.Expr, known)
			}
		}
	}
	walk(d.Panels)
}

func checkDatasource(t *testing.T, where string, raw json.RawMessage) {
	t.Helper()
	var ds struct{ Type, UID string }
	if err := json.Unmarshal(raw, &ds); err != nil || ds.UID != templatedDatasource || ds.Type != "prometheus" {
		t.Errorf("%s: datasource %s, want {type: prometheus, uid: %s}", where, raw, templatedDatasource)
	}
}

// githubAnchor is the id GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	alertLine   = regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`)
	runbookLine = regexp.MustCompile(`(?m)^\s*runbook_url: \{\{ \$runbook \}\}#(\S+)$`)
	exprLines   = regexp.MustCompile(`(?ms)^\s*expr: (\|-\n.*?|[^\n]*)\n\s*(for|labels):`)
)

func TestRules(t *testing.T) {
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	alerts := alertLine.FindAllStringSubmatch(text, -1)
	runbooks := runbookLine.FindAllStringSubmatch(text, -1)
	if len(alerts) == 0 || len(alerts) != len(runbooks) {
		t.Fatalf("%d alerts, %d runbook_url lines: every alert links its runbook", len(alerts), len(runbooks))
	}
	doc, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if h, ok := strings.CutPrefix(line, "#"); ok && !inFence {
			anchors[githubAnchor(strings.TrimLeft(h, "# "))] = true
		}
	}
	for i, rb := range runbooks {
		if !anchors[rb[1]] {
			t.Errorf("alert %s: runbook #%s is no heading of %s", alerts[i][1], rb[1], runbookFile)
		}
	}
	exprs := exprLines.FindAllStringSubmatch(text, -1)
	if len(exprs) != len(alerts) {
		t.Fatalf("found %d expressions for %d alerts", len(exprs), len(alerts))
	}
	known := codeMetrics(t)
	for i, e := range exprs {
		// Template actions are not PromQL: drop them before reading names.
		expr := regexp.MustCompile(`\{\{[^}]*\}\}`).ReplaceAllString(e[1], `x`)
		checkMetrics(t, "alert "+alerts[i][1], expr, known)
	}
}

func TestMetricsOf(t *testing.T) {
	got := metricsOf(`histogram_quantile(0.99, sum by (le) (rate(apiserver_admission_webhook_admission_duration_seconds_bucket{name="pods.gpu-injector.io", job="gpu_injector_x"}[$__rate_interval]))) / up`)
	want := []string{"apiserver_admission_webhook_admission_duration_seconds", "up"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("metricsOf = %v, want %v", got, want)
	}
}

// grafanaVariables are the dashboard's variables and Grafana's own, with a
// value each, so that an expression becomes PromQL as Grafana sends it.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$namespace", ".*")

// TestDashboardPromQL parses every query of the dashboard with Prometheus's
// own parser, through `promtool check rules` on a recording rule per query.
// hack/monitoring-test.sh sets $PROMTOOL; without it the test is skipped.
func TestDashboardPromQL(t *testing.T) {
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		t.Skip("$PROMTOOL is unset (hack/monitoring-test.sh sets it)")
	}
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel_%d_%s", p.ID, tg.RefID), Expr: grafanaVariables.Replace(tg.Expr)})
			}
		}
	}
	walk(d.Panels)
	// JSON is YAML: promtool reads the file as it is written.
	file := map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", len(rules), err, out)
	}
	t.Logf("%d queries parsed: %s", len(rules), strings.TrimSpace(string(out)))
}
