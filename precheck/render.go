package precheck

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpu-injector/gpu-injector/layout"
)

// render writes the report as the table a person reads. Values quote what
// nodes published, so every cell goes through layout.Printable.
func render(out io.Writer, r *Report) error {
	var b bytes.Buffer
	renderTo(&b, r)
	// tabwriter pads an empty last cell.
	lines := strings.SplitAfter(b.String(), "\n")
	for i, l := range lines {
		if strings.HasSuffix(l, "\n") {
			lines[i] = strings.TrimRight(l, " \n") + "\n"
		}
	}
	if _, err := io.WriteString(out, strings.Join(lines, "")); err != nil {
		return fmt.Errorf("failed to write the report: %w", err)
	}
	return nil
}

func renderTo(b *bytes.Buffer, r *Report) {
	cfg := r.Config
	fmt.Fprintf(b, "CONFIGURATION  %s: driverDelivery %s, podSecurity %s, GPU resources %s\n\n",
		cfg.Source, cfg.DriverDelivery, cfg.PodSecurity, strings.Join(cfg.Resources, ", "))

	fmt.Fprintf(b, "GPU NODES (what a GPU pod that lands there gets)\n")
	if len(r.Nodes) == 0 {
		fmt.Fprintf(b, "  none\n")
	} else {
		tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
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
	fmt.Fprintf(b, "\nDEVICE PLUGIN  %s\n", layout.Printable(plugin))
	fmt.Fprintf(b, "WEBHOOK        %s: %s\n", r.Webhook.Outcome, layout.Printable(r.Webhook.Message))

	fmt.Fprintf(b, "\nOPTED-IN NAMESPACES (%s=%s)\n", layout.LabelInject, layout.InjectEnabled)
	if len(r.Namespaces) == 0 {
		fmt.Fprintf(b, "  none\n")
	} else {
		tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAMESPACE\tENFORCE\tNOTE")
		for _, ns := range r.Namespaces {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", ns.Name, dash(ns.Enforce), layout.Printable(namespaceNote(ns)))
		}
		tw.Flush()
	}
	list(b, "NOTES", r.Notes)
	if len(r.Attention) == 0 {
		fmt.Fprintf(b, "\nOK: nothing needs attention\n")
	} else {
		list(b, "NEEDS ATTENTION (docs/troubleshooting.md)", r.Attention)
	}
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

func list(b *bytes.Buffer, title string, lines []string) {
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "\n%s\n", title)
	for _, l := range lines {
		fmt.Fprintf(b, "  -  %s\n", layout.Printable(l))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
