package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLegend(t *testing.T) {
	m := map[string]string{"code": "200", "node": "gke-t4"}
	for _, tc := range []struct{ format, want string }{
		{"HTTP {{code}}", "HTTP 200"},
		{"{{ node }}: {{state}}", "gke-t4: "}, // Grafana leaves a missing label empty
		{"injected", "injected"},
		{"", `{code="200", node="gke-t4"}`},
	} {
		if got := legend(tc.format, m); got != tc.want {
			t.Errorf("legend(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
	if got := absent("rejected: {{error_type}}"); got != "rejected: <error_type>: no series" {
		t.Errorf("absent = %q", got)
	}
}

// TestScript: every panel is drawn, its series from a data file with its
// legend, a panel without series says so, and a gap stays a gap.
func TestScript(t *testing.T) {
	data, work := t.TempDir(), t.TempDir()
	files := map[string]string{
		"panel-02.json": `{"id":2,"title":"GPU pods by outcome","type":"timeseries","unit":"reqps","start":100,"end":200,"step":5,
			"targets":[{"legendFormat":"skipped: {{reason}}","result":[{"metric":{"reason":"no-gpu"},"values":[[100,"0.5"],[105,"NaN"],[110,"1"]]}]},
			{"legendFormat":"denied","result":[]}]}`,
		"panel-16.json": `{"id":16,"title":"Pools by state","type":"table","start":100,"end":200,"step":5,
			"targets":[{"legendFormat":"{{pool}}","result":[]}]}`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(data, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(data, work, filepath.Join(work, "out.png")); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(work, "dashboard.gp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"set multiplot layout 1,3", `set title "GPU pods by outcome"`, `title "skipped: no-gpu"`,
		`title "denied: no series"`, `set title "Pools by state (table panel, drawn over time)"`,
		`set label 1 "` + emptyNote + `"`, `set ylabel "requests/s"`,
	} {
		if !strings.Contains(string(script), want) {
			t.Errorf("script lacks %s:\n%s", want, script)
		}
	}
	if strings.Count(string(script), emptyNote) != 1 {
		t.Errorf("want one panel without data:\n%s", script)
	}
	dat, err := os.ReadFile(filepath.Join(work, "panel-02-0-0.dat"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(dat), "100 0.5\n105 ?\n110 1\n"; got != want {
		t.Errorf("data file %q, want %q", got, want)
	}
}
