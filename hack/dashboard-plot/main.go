// Command dashboard-plot turns what TestStatusPrometheus writes with
// GPU_INJECTOR_DASHBOARD_DATA set (one JSON file per panel of the chart's
// Grafana dashboard: its title, type, unit, and each target's range query
// with its result) into a gnuplot script and data files that draw every
// panel in one PNG grid. Grafana itself is not run: this shows what its
// panels would plot from the same Prometheus.
//
//	go run ./hack/dashboard-plot -data DIR -work WORKDIR -out docs/day-two-dashboard.png
//	gnuplot WORKDIR/dashboard.gp
//
// hack/dashboard-plot.sh does both.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// panel is one file of the data folder.
type panel struct {
	ID      int      `json:"id"`
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Unit    string   `json:"unit"`
	Start   int64    `json:"start"`
	End     int64    `json:"end"`
	Step    int      `json:"step"`
	Targets []target `json:"targets"`
}

type target struct {
	Expr         string   `json:"expr"`
	Query        string   `json:"query"`
	LegendFormat string   `json:"legendFormat"`
	Result       []series `json:"result"`
}

// series is one element of a Prometheus matrix.
type series struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"`
}

const (
	columns     = 3
	panelWidth  = 560
	panelHeight = 390
	titleHeight = 70
	// emptyNote is what a panel without a single series says: on the
	// cluster the data comes from, those are the panels of probe errors and
	// pools, which a healthy cluster has none of.
	emptyNote = "no data on a healthy cluster"
)

func main() {
	data := flag.String("data", "", "the folder of panel-*.json files")
	work := flag.String("work", "", "where to write dashboard.gp and its data files")
	out := flag.String("out", "docs/day-two-dashboard.png", "the PNG the script draws")
	flag.Parse()
	if *data == "" || *work == "" {
		fmt.Fprintln(os.Stderr, "usage: dashboard-plot -data DIR -work DIR [-out PNG]")
		os.Exit(2)
	}
	if err := run(*data, *work, *out); err != nil {
		fmt.Fprintf(os.Stderr, "dashboard-plot: %v\n", err)
		os.Exit(1)
	}
}

func run(data, work, out string) error {
	panels, err := readPanels(data)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	script, err := writeScript(panels, work, absOut)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(work, "dashboard.gp"), []byte(script), 0o644)
}

func readPanels(dir string) ([]panel, error) {
	files, err := filepath.Glob(filepath.Join(dir, "panel-*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no panel-*.json in %s", dir)
	}
	var panels []panel
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var p panel
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		panels = append(panels, p)
	}
	// The dashboard's order: its ids grow down the page.
	sort.Slice(panels, func(i, j int) bool { return panels[i].ID < panels[j].ID })
	return panels, nil
}

var placeholder = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legend is Grafana's: legendFormat with {{label}} replaced by the series'
// label (empty when it lacks it), or the series' labels when there is no
// format.
func legend(format string, metric map[string]string) string {
	if format == "" {
		var keys []string
		for k := range metric {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+"=\""+metric[k]+"\"")
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return placeholder.ReplaceAllStringFunc(format, func(m string) string {
		return metric[placeholder.FindStringSubmatch(m)[1]]
	})
}

// absent names a target that returned no series, its placeholders shown as
// <label> since there is no series to take them from.
func absent(format string) string {
	if format == "" {
		format = "query"
	}
	return placeholder.ReplaceAllString(format, "<$1>") + ": no series"
}

// quote makes s a gnuplot double-quoted string.
func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// value parses a Prometheus sample value; NaN and infinities are gaps.
func value(v any) (float64, bool) {
	s, _ := v.(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

func unitLabel(unit string) string {
	switch unit {
	case "reqps":
		return "requests/s"
	case "s":
		return "seconds"
	case "":
		return ""
	default:
		return unit
	}
}

func writeScript(panels []panel, work, out string) (string, error) {
	rows := (len(panels) + columns - 1) / columns
	var start, end int64
	for _, p := range panels {
		if start == 0 || p.Start < start {
			start = p.Start
		}
		if p.End > end {
			end = p.End
		}
	}
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	w("# Written by hack/dashboard-plot from the range queries of every panel of")
	w("# charts/gpu-injector/files/dashboard.json; run with gnuplot.")
	w("set terminal pngcairo size %d,%d font 'DejaVu Sans,10' noenhanced", columns*panelWidth, rows*panelHeight+titleHeight)
	w("set output %s", quote(out))
	w("set datafile missing '?'")
	w("set xdata time")
	w("set timefmt '%%s'")
	w("set format x '%%H:%%M'")
	w("set xtics 60")
	w("set xlabel 'UTC' offset 0,0.5")
	w("set xrange [%s:%s]", quote(strconv.FormatInt(start, 10)), quote(strconv.FormatInt(end, 10)))
	w("set grid")
	w("set key below left Left reverse samplen 2 spacing 1 width 1 maxrows 4")
	w("set border 3")
	w("set tics nomirror")
	w("set linetype cycle 8")
	w("set lmargin 10")
	title := fmt.Sprintf("gpu-injector dashboard: its panels' queries plotted from a real Prometheus scraping the e2e cluster (%s to %s UTC; Grafana not run)",
		time.Unix(start, 0).UTC().Format("2006-01-02 15:04:05"), time.Unix(end, 0).UTC().Format("15:04:05"))
	w("set multiplot layout %d,%d title %s font ',14'", rows, columns, quote(title))
	for _, p := range panels {
		panelTitle := p.Title
		switch p.Type {
		case "timeseries":
		default:
			panelTitle += fmt.Sprintf(" (%s panel, drawn over time)", p.Type)
		}
		w("")
		w("# panel %d: %s", p.ID, p.Title)
		w("set title %s font ',12'", quote(panelTitle))
		w("set ylabel %s", quote(unitLabel(p.Unit)))
		w("unset label")
		var plots []string
		var missing []string
		top := 0.0
		n, points := 0, 0
		for ti, t := range p.Targets {
			if len(t.Result) == 0 {
				missing = append(missing, absent(t.LegendFormat))
				continue
			}
			for si, s := range t.Result {
				name := fmt.Sprintf("panel-%02d-%d-%d.dat", p.ID, ti, si)
				var d strings.Builder
				for _, v := range s.Values {
					ts, _ := v[0].(float64)
					f, ok := value(v[1])
					if !ok {
						fmt.Fprintf(&d, "%d ?\n", int64(ts))
						continue
					}
					top = math.Max(top, f)
					points++
					fmt.Fprintf(&d, "%d %g\n", int64(ts), f)
				}
				if err := os.WriteFile(filepath.Join(work, name), []byte(d.String()), 0o644); err != nil {
					return "", err
				}
				n++
				plots = append(plots, fmt.Sprintf("%s using 1:2 with lines lw 2 title %s", quote(filepath.Join(work, name)), quote(legend(t.LegendFormat, s.Metric))))
			}
		}
		for _, m := range missing {
			plots = append(plots, fmt.Sprintf("1/0 with lines lc rgb 'gray50' dt 2 title %s", quote(m)))
		}
		switch {
		case n == 0:
			w("set label 1 %s at graph 0.5,0.55 center font ',14' textcolor rgb 'gray40'", quote(emptyNote))
		case points == 0:
			// Series without a value: a histogram with no observation in
			// the rate's range has no quantile.
			w("set label 1 %s at graph 0.5,0.55 center font ',14' textcolor rgb 'gray40'", quote("no value in this window (NaN)"))
		case top == 0:
			w("set label 1 %s at graph 0.5,0.55 center font ',14' textcolor rgb 'gray40'", quote("0 throughout"))
		}
		// Room above the highest line, so that a constant (a stat's value)
		// is not drawn on the frame, and below zero, so that a line of zeros
		// is not hidden by the axis.
		if top <= 0 {
			top = 1 / 1.2
		}
		w("set yrange [%g:%g]", -top*0.05, top*1.2)
		// The last value, as a stat panel shows it.
		if p.Type == "stat" && n == 1 {
			if last, ok := lastValue(p); ok {
				w("set label 2 %s at graph 0.98,0.92 right font ',16'", quote(fmt.Sprintf("now %.3g", last)))
			}
		}
		w("plot %s", strings.Join(plots, ", \\\n     "))
	}
	w("unset multiplot")
	return b.String(), nil
}

func lastValue(p panel) (float64, bool) {
	for _, t := range p.Targets {
		for _, s := range t.Result {
			for i := len(s.Values) - 1; i >= 0; i-- {
				if f, ok := value(s.Values[i][1]); ok {
					return f, true
				}
			}
		}
	}
	return 0, false
}
