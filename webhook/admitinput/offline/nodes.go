package offline

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
)

// maxNodeNotes bounds the nodes named one by one; the rest are counted.
const maxNodeNotes = 10

// nodeNotes say why nodes lend the webhook no layout where the files, not
// the probe, are the reason: a node whose probe publishes a layout (or a
// wedged driver) but that is not Ready or is cordoned, as the index reads
// it, and, when no layout is left and no node is named, that none is
// usable (with driverDelivery Runtime no layout is read, and neither is
// said); and how many nodes are wedged.
func nodeNotes(nodes []corev1.Node, layouts admitinput.LayoutSource, cfg *config.Configuration) []string {
	notes := layoutNotes(nodes, layouts, cfg)
	if w := layouts.Wedged(); len(w) > 0 {
		notes = append(notes, fmt.Sprintf("%d nodes have a wedged NVIDIA driver and get no GPU pods", len(w)))
	}
	return notes
}

// layoutNotes name the nodes the index does not count, or say that no
// layout is left.
func layoutNotes(nodes []corev1.Node, layouts admitinput.LayoutSource, cfg *config.Configuration) []string {
	if cfg.DriverDelivery == config.DeliveryRuntime {
		return nil
	}
	var notes []string
	more := 0
	for i := range nodes {
		why := notCounted(&nodes[i])
		switch {
		case why == "":
		case len(notes) < maxNodeNotes:
			notes = append(notes, why)
		default:
			more++
		}
	}
	if more > 0 {
		notes = append(notes, fmt.Sprintf("%d more nodes are not counted, for the same reasons", more))
	}
	if len(layouts.Layouts()) == 0 && len(notes) == 0 {
		notes = append(notes, fmt.Sprintf("none of the %d nodes publishes a usable layout", len(nodes)))
	}
	return notes
}

// notCounted says why the index does not count a node its probe marked
// ready or wedged; empty when it does, or when the probe is the reason.
func notCounted(n *corev1.Node) string {
	if s := n.Labels[layout.LabelState]; s != layout.StateReady && s != layout.StateWedged {
		return ""
	}
	const only = "the webhook reads a node's layout only when the node is Ready"
	var ready *corev1.NodeCondition
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			ready = &n.Status.Conditions[i]
			break
		}
	}
	switch {
	case ready == nil:
		return fmt.Sprintf("node %s has no Ready condition: %s (`gpu-injector nodeprobe --once` prints the probe's labels and annotations alone; `kubectl get node %s -o yaml` has the kubelet's conditions)", n.Name, only, n.Name)
	case ready.Status != corev1.ConditionTrue:
		why := string(ready.Status)
		if ready.Reason != "" {
			why += ", " + ready.Reason
		}
		return fmt.Sprintf("node %s is not Ready (Ready=%s): %s", n.Name, why, only)
	case n.Spec.Unschedulable:
		return fmt.Sprintf("node %s is cordoned (spec.unschedulable): the webhook reads a node's layout only when the node is schedulable", n.Name)
	}
	return ""
}
