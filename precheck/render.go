package precheck

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpu-injector/gpu-injector/layout"
)

// render writes the report as the table a person reads. Values quote what
// nodes published, so every cell goes through layout.Printable.
func render(out io.Writer, r *Report) error {
	ew := &errWriter{w: out}
	cfg := r.Config
	ew.printf("CONFIGURATION  %s: driverDelivery %s, podSecurity %s, GPU resources %s\n\n",
		cfg.Source, cfg.DriverDelivery, cfg.PodSecurity, strings.Join(cfg.Resources, ", "))

	ew.printf("GPU NODES (what a GPU pod that lands there gets)\n")
	if len(r.Nodes) == 0 {
		ew.printf("  none\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tDELIVERY\tGPUS\tWHY")
		for _, n := range r.Nodes {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", layout.Printable(n.Name), n.Delivery, n.AllocatableGPUs, layout.Printable(n.Why))
		}
		tw.Flush()
	}

	d := r.DevicePlugin
	plugin := fmt.Sprintf("%d of %d GPU nodes advertise allocatable GPUs", d.Advertising, len(r.Nodes))
	if len(d.Without) > 0 {
		plugin += "; none on " + strings.Join(d.Without, ", ")
	}
	ew.printf("\nDEVICE PLUGIN  %s\n", layout.Printable(plugin))
	ew.printf("WEBHOOK        %s: %s\n", r.Webhook.Outcome, layout.Printable(r.Webhook.Message))

	ew.printf("\nOPTED-IN NAMESPACES (%s=%s)\n", layout.LabelInject, layout.InjectEnabled)
	if len(r.Namespaces) == 0 {
		ew.printf("  none\n")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAMESPACE\tENFORCE\tNOTE")
		for _, ns := range r.Namespaces {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", ns.Name, dash(ns.Enforce), layout.Printable(namespaceNote(ns)))
		}
		tw.Flush()
	}
	list(ew, "NOTES", r.Notes)
	if len(r.Attention) == 0 {
		ew.printf("\nOK: nothing needs attention\n")
	} else {
		list(ew, "NEEDS ATTENTION (docs/troubleshooting.md)", r.Attention)
	}
	return ew.err
}

func namespaceNote(ns NamespaceCheck) string {
	switch {
	case ns.Excluded:
		return "excluded: the webhook never sees it"
	case len(ns.Refused) > 0:
		return "its GPU pods cannot get the driver on " + strings.Join(ns.Refused, ", ") + ": " + ns.Message
	case ns.Enforce == "baseline" || ns.Enforce == "restricted":
		return "no GPU node needs what this level forbids"
	}
	return ""
}

func list(ew *errWriter, title string, lines []string) {
	if len(lines) == 0 {
		return
	}
	ew.printf("\n%s\n", title)
	for _, l := range lines {
		ew.printf("  -  %s\n", layout.Printable(l))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// errWriter keeps the first write error, so that rendering reads straight.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
