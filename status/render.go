package status

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gpu-injector/gpu-injector/layout"
)

// RenderOptions shape the table.
type RenderOptions struct {
	// Color paints good, bad and doubtful values green, red and yellow.
	Color bool
	// Width cuts the last column of each table to fit; 0 cuts nothing.
	Width int
	// Now is the clock ages are counted from.
	Now time.Time
}

type tone int

const (
	plain tone = iota
	good
	bad
	warn
)

// ANSI foreground colours. Each is 5 bytes, and plain text gets "default
// colour" of the same length, so that widths are counted without them.
var toneCodes = map[tone]string{plain: "\x1b[39m", good: "\x1b[32m", bad: "\x1b[31m", warn: "\x1b[33m"}

const resetCode = "\x1b[0m"

type cell struct {
	text string
	tone tone
}

func txt(text string) cell           { return cell{text: text} }
func toned(t tone, text string) cell { return cell{text: text, tone: t} }

// table is a set of aligned columns; its last column is cut to the width.
// Not text/tabwriter: it counts colour codes as width, which misaligns a
// column whose cells are coloured differently.
type table struct {
	header []string
	rows   [][]cell
}

func (t *table) add(cells ...cell) { t.rows = append(t.rows, cells) }

func (t *table) write(w *errWriter, o RenderOptions, indent string) {
	n := len(t.header)
	for _, r := range t.rows {
		n = max(n, len(r))
	}
	widths := make([]int, n)
	for i, h := range t.header {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range t.rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(layout.Printable(c.text)))
		}
	}
	line := func(cells []cell) {
		var b strings.Builder
		b.WriteString(indent)
		used := len(indent)
		for i, c := range cells {
			// Cells quote what nodes and pods wrote.
			text := layout.Printable(c.text)
			last := i == len(cells)-1
			if last && o.Width > 0 {
				text = cut(text, max(o.Width-used, 20))
			}
			if o.Color {
				b.WriteString(toneCodes[c.tone] + text + resetCode)
			} else {
				b.WriteString(text)
			}
			if !last {
				pad := widths[i] - utf8.RuneCountInString(text) + 2
				b.WriteString(strings.Repeat(" ", pad))
				used += widths[i] + 2
			}
		}
		w.printf("%s\n", strings.TrimRight(b.String(), " "))
	}
	if len(t.header) > 0 {
		var h []cell
		for _, s := range t.header {
			h = append(h, txt(s))
		}
		line(h)
	}
	for _, r := range t.rows {
		line(r)
	}
}

// cut shortens s to n runes, marking the cut.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// errWriter keeps the first write error, so that rendering reads straight.
type errWriter struct {
	w   io.Writer
	err error
}

func (w *errWriter) printf(format string, args ...any) {
	if w.err == nil {
		_, w.err = fmt.Fprintf(w.w, format, args...)
	}
}

// Render writes the report as a person reads it: one block per section, bad
// news in red, and what needs attention last, where the eye lands.
func Render(out io.Writer, r *Report, o RenderOptions) error {
	w := &errWriter{w: out}
	renderWebhook(w, r.Webhook, o)
	renderProbe(w, r.Probe, o)
	renderNodes(w, r, o)
	renderPools(w, r.Pools, o)
	renderNamespaces(w, r.Namespaces, o)
	renderEvents(w, r.Events, o)
	w.printf("\nPODS ADMITTED WITHOUT THEIR IMAGES' CONFIGURATION\n")
	imagesUnreadLines(w, r.ImagesUnread, o)
	renderAttention(w, r.Attention, o)
	return w.err
}

// renderWebhook writes the webhook's block: its Deployment, its
// MutatingWebhookConfiguration and what the dry run of a GPU pod got.
func renderWebhook(w *errWriter, wh WebhookStatus, o RenderOptions) {
	w.printf("WEBHOOK\n")
	top := &table{}
	switch {
	case wh.Deployment == "":
		top.add(txt("deployment"), toned(warn, "not found (labels "+webhookSelector+")"))
	case wh.Ready == 0:
		top.add(txt("deployment"), toned(bad, fmt.Sprintf("%s/%s  %d/%d ready", wh.Namespace, wh.Deployment, wh.Ready, wh.Desired)))
	case wh.Ready < wh.Desired:
		top.add(txt("deployment"), toned(warn, fmt.Sprintf("%s/%s  %d/%d ready", wh.Namespace, wh.Deployment, wh.Ready, wh.Desired)))
	default:
		top.add(txt("deployment"), toned(good, fmt.Sprintf("%s/%s  %d/%d ready", wh.Namespace, wh.Deployment, wh.Ready, wh.Desired)))
	}
	switch {
	case wh.Configuration == "":
		top.add(txt("configuration"), toned(bad, "no MutatingWebhookConfiguration: no pod is sent to the webhook"))
	case !wh.CABundle:
		top.add(txt("configuration"), toned(bad, fmt.Sprintf("%s  failurePolicy %s, no CA bundle", wh.Configuration, wh.FailurePolicy)))
	default:
		top.add(txt("configuration"), toned(good, fmt.Sprintf("%s  failurePolicy %s, CA bundle set", wh.Configuration, wh.FailurePolicy)))
	}
	for i, line := range dryRunLines(wh.DryRun) {
		label := ""
		if i == 0 {
			label = "dry-run GPU pod"
		}
		top.add(txt(label), line)
	}
	top.write(w, o, "  ")
}

// renderProbe writes the probe's block: its DaemonSet's pods.
func renderProbe(w *errWriter, p ProbeStatus, o RenderOptions) {
	w.printf("\nPROBE\n")
	probe := &table{}
	switch {
	case p.DaemonSet == "":
		probe.add(txt("daemonset"), toned(warn, "not found (labels "+probeSelector+")"))
	default:
		t := good
		if p.Ready < p.Desired {
			t = bad
		}
		probe.add(txt("daemonset"), toned(t, fmt.Sprintf("%s/%s  %d desired, %d ready, %d available", p.Namespace, p.DaemonSet, p.Desired, p.Ready, p.Available)))
	}
	probe.write(w, o, "  ")
}

// renderNodes writes the GPU nodes' block: a row per node, then what the
// NRI plugin and stale drivers say of them.
func renderNodes(w *errWriter, r *Report, o RenderOptions) {
	w.printf("\nGPU NODES\n")
	if len(r.Nodes) == 0 {
		w.printf("  none: no node publishes a layout or advertises a GPU\n")
		return
	}
	nodes := &table{header: []string{"NODE", "STATE", "DRIVER", "FINGERPRINT", "GPUS", "INJECTS", "REASON"}}
	for _, n := range r.Nodes {
		state, t := n.State, good
		switch {
		case state == "":
			state, t = "(no probe)", warn
		case nodeAttention(n) != "":
			t = bad
		case state != layout.StateReady:
			t = plain
		}
		if n.Unschedulable {
			state += ",unschedulable"
		}
		nodes.add(txt(n.Name), toned(t, state), txt(dash(n.DriverVersion)), txt(dash(n.Fingerprint)), txt(fmt.Sprint(n.GPUs)), txt(injects(n)), toned(t, n.Reason))
	}
	nodes.write(w, o, "  ")
	if line, t := pluginLine(r.Plugin); line != "" {
		note := &table{}
		note.add(toned(t, line))
		note.write(w, o, "  ")
	}
	if lines := staleDriverLines(r.Nodes); len(lines) > 0 {
		note := &table{}
		for _, l := range lines {
			note.add(l)
		}
		note.write(w, o, "  ")
	}
}

// renderPools writes the pool memory's block: each pool remembered and
// when its memory expires, and each pool served from its declaration.
func renderPools(w *errWriter, pl PoolsStatus, o RenderOptions) {
	w.printf("\nPOOLS\n")
	switch {
	case !pl.Found && len(pl.Pools) == 0:
		w.printf("  none remembered (no ConfigMap %s)\n", dash(pl.ConfigMap))
	case len(pl.Pools) == 0:
		w.printf("  none remembered (%s)%s\n", pl.ConfigMap, notePart(pl.Note))
	default:
		pools := &table{header: []string{"POOL", "FINGERPRINT", "DRIVER", "LAST SEEN", "EXPIRES IN"}}
		for _, m := range pl.Pools {
			if m.Declared {
				pools.add(txt(m.Pool), txt(m.Fingerprint), txt(m.DriverVersion), txt("declared"), txt("never"))
				continue
			}
			left := m.Expires.Sub(o.Now)
			t := plain
			switch {
			case left <= 0:
				t = bad
			case left < 24*time.Hour:
				t = warn
			}
			pools.add(txt(m.Pool), txt(m.Fingerprint), txt(m.DriverVersion), txt(age(o.Now.Sub(m.LastSeen))+" ago"), toned(t, age(left)))
		}
		pools.write(w, o, "  ")
		if pl.Note != "" {
			w.printf("  %s\n", pl.Note)
		}
	}
}

// renderNamespaces writes the opted-in namespaces' block, with those whose
// Pod Security refuses GPU pods and those the configuration excludes.
func renderNamespaces(w *errWriter, namespaces []NamespaceStatus, o RenderOptions) {
	w.printf("\nOPTED-IN NAMESPACES (%s=%s)\n", layout.LabelInject, layout.InjectEnabled)
	if len(namespaces) == 0 {
		w.printf("  none: GPU pods are injected nowhere\n")
		return
	}
	nss := &table{header: []string{"NAMESPACE", "ENFORCE", "NOTE"}}
	for _, n := range namespaces {
		switch {
		case n.Refused != "":
			nss.add(txt(n.Name), toned(bad, n.Enforce), toned(bad, n.Refused))
		case n.Excluded:
			nss.add(txt(n.Name), txt(dash(n.Enforce)), toned(warn, "excluded by the configuration: never injected"))
		default:
			nss.add(txt(n.Name), txt(dash(n.Enforce)), txt(""))
		}
	}
	nss.write(w, o, "  ")
}

// renderEvents writes the last hour's layout mismatch Events.
func renderEvents(w *errWriter, events []EventStatus, o RenderOptions) {
	w.printf("\nLAYOUT MISMATCH EVENTS (last hour)\n")
	if len(events) == 0 {
		w.printf("  none\n")
		return
	}
	evs := &table{header: []string{"NAMESPACE", "OBJECT", "COUNT", "LAST", "MESSAGE"}}
	for _, e := range events {
		evs.add(txt(e.Namespace), txt(e.Object), txt(fmt.Sprint(e.Count)), txt(age(o.Now.Sub(e.Last))+" ago"), toned(bad, e.Message))
	}
	evs.write(w, o, "  ")
}

// renderAttention writes what needs attention, or that nothing does.
func renderAttention(w *errWriter, attention []string, o RenderOptions) {
	w.printf("\n")
	if len(attention) == 0 {
		at := &table{}
		at.add(toned(good, "OK: nothing needs attention"))
		at.write(w, o, "")
		return
	}
	w.printf("NEEDS ATTENTION (docs/troubleshooting.md)\n")
	at := &table{}
	for _, a := range attention {
		at.add(txt("-"), toned(bad, a))
	}
	at.write(w, o, "  ")
}

// dryRunLines says what the API server answered to the dry run.
func dryRunLines(d DryRunLog) []cell {
	var out []cell
	switch d.Outcome {
	case DryRunSkipped:
		out = append(out, toned(warn, "skipped: "+d.Message))
	case DryRunInjected:
		what := "layout " + dash(d.Fingerprint)
		if d.DriverVersion != "" {
			what += " (driver " + d.DriverVersion + ")"
		}
		if d.Runtime == layout.InjectedByNRI {
			what = "runtime injection by the node's NRI plugin"
		}
		if d.Policy {
			// The policy's pod proves nothing of the webhook, which it never called.
			out = append(out, toned(good, fmt.Sprintf("in %s: the API server's admission policy marked it for %s, with no webhook call", d.Namespace, what)))
		} else {
			out = append(out, toned(good, fmt.Sprintf("in %s: the API server reaches the webhook, which injected %s", d.Namespace, what)))
		}
		if len(d.HostPaths) > 0 {
			out = append(out, txt("hostPath "+strings.Join(d.HostPaths, ", ")))
		}
		if len(d.NodeSelector) > 0 {
			var sel []string
			for _, k := range slices.Sorted(maps.Keys(d.NodeSelector)) {
				sel = append(sel, k+"="+d.NodeSelector[k])
			}
			out = append(out, txt("nodeSelector "+strings.Join(sel, ", ")))
		}
		if d.RuntimeInject != "" {
			out = append(out, txt(layout.AnnotationRuntimeInject+"="+d.RuntimeInject))
		}
	case DryRunUnchanged:
		out = append(out, toned(bad, fmt.Sprintf("in %s: admitted WITHOUT injection (webhook skipped it, or failurePolicy Ignore hid an unreachable webhook)", d.Namespace)))
	case DryRunDenied:
		out = append(out, toned(bad, fmt.Sprintf("in %s: DENIED: %s", d.Namespace, d.Message)))
	case DryRunUnreachable:
		out = append(out, toned(bad, fmt.Sprintf("in %s: the API server CANNOT REACH the webhook: %s", d.Namespace, d.Message)))
	case DryRunError:
		out = append(out, toned(warn, fmt.Sprintf("in %s: failed: %s", d.Namespace, d.Message)))
	}
	for _, wn := range d.Warnings {
		out = append(out, toned(warn, "warning: "+wn))
	}
	return out
}

// injects says who puts the driver into a GPU container on the node.
func injects(n NodeStatus) string {
	switch {
	case n.NRIPlugin != "":
		return "nri-plugin " + n.NRIPlugin
	case n.Runtime != "":
		return n.Runtime
	case n.State == layout.StateReady:
		return "hostPath"
	}
	return "-"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func notePart(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// age is a duration as kubectl prints ages: its largest unit or two.
func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}
