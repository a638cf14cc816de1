package precheck

import (
	"fmt"
	"strings"

	"github.com/gpu-injector/gpu-injector/layout"
)

// summarize fills Notes and Attention from the sections, in the order the
// report prints them.
func (r *Report) summarize() {
	r.Attention, r.Notes = []string{}, []string{}
	if len(r.Nodes) == 0 {
		r.note("no GPU node found (no probe state, GPU capacity or GPU label): with pools at zero, run precheck again once a GPU node is up")
	}
	for _, n := range r.Nodes {
		if n.NeedsAttention {
			r.attention("node %s: %s", n.Name, n.Why)
		}
	}
	if d := r.DevicePlugin; len(d.Without) > 0 {
		r.attention("no allocatable GPU (of resources.names) on %s: the scheduler places no GPU pod there; check the device plugin's pod on them",
			strings.Join(d.Without, ", "))
		r.note("a node whose GPUs come through DRA ResourceSlices alone advertises none: precheck does not read ResourceSlices")
	}
	if w := r.Webhook; w.Outcome == WebhookFailed {
		r.attention("webhook: %s", w.Message)
	}
	opted := 0
	for _, ns := range r.Namespaces {
		if ns.Excluded {
			r.note("namespace %s is labelled %s=%s but the webhook never sees it (the release's namespace or excludedNamespaces)", ns.Name, layout.LabelInject, layout.InjectEnabled)
			continue
		}
		opted++
		if len(ns.Refused) > 0 {
			r.attention("namespace %s enforces Pod Security %q: its GPU pods cannot get the driver on %s (%s); label it %s=privileged, or run gpu-injector's NRI plugin on those nodes",
				ns.Name, ns.Enforce, strings.Join(ns.Refused, ", "), ns.Reason, labelEnforce)
		}
	}
	if opted == 0 {
		r.note("no namespace is opted in: label one, kubectl label namespace NAME %s=%s", layout.LabelInject, layout.InjectEnabled)
	}
}

func (r *Report) attention(format string, args ...any) {
	r.Attention = append(r.Attention, fmt.Sprintf(format, args...))
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}
