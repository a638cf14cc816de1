package status

import (
	"fmt"
	"strings"

	"github.com/gpu-injector/gpu-injector/layout"
)

// readStaleDriver reads a node's gpu-injector.io/stale-driver annotation
// (the NRI plugin's scan for pods on a deleted driver, published by the
// probe) into n; one that does not decode is said, not believed.
func readStaleDriver(n *NodeStatus, annotations map[string]string) {
	v, ok := annotations[layout.AnnotationStaleDriver]
	if !ok {
		return
	}
	s, err := layout.DecodeStaleDriver(v)
	if err != nil {
		n.StaleDriverNote = err.Error()
		return
	}
	n.StaleDriver = &s
}

// staleDriverAttention names the pods to restart, node by node.
func (r *Report) staleDriverAttention() {
	for _, n := range r.Nodes {
		if s := n.StaleDriver; s != nil && s.StalePods > 0 {
			r.attention("node %s: %s", n.Name, stalePodsText(n))
		}
	}
}

// stalePodsText says which pods run a deleted driver, as the node has them,
// naming only those that run on it.
func stalePodsText(n NodeStatus) string {
	s := n.StaleDriver
	names := strings.Join(s.Pods, ", ")
	if more := s.StalePods - len(s.Pods) - n.StaleDriverNotOnNode; more > 0 {
		if names == "" {
			names = fmt.Sprintf("%d unnamed", more)
		} else {
			names += fmt.Sprintf(" and %d more", more)
		}
	}
	if names == "" {
		names = "none it names runs on it"
	}
	text := fmt.Sprintf("%d GPU pods run a driver deleted since they started (a driver upgrade); restart them: %s", s.StalePods, names)
	if n.StaleDriverNotOnNode > 0 {
		text += fmt.Sprintf(" (%d pods the node named do not run on it: not shown)", n.StaleDriverNotOnNode)
	}
	return text
}

// staleDriverLines are the report's lines under GPU NODES about stale
// drivers and records that do not decode.
func staleDriverLines(nodes []NodeStatus) []cell {
	var out []cell
	for _, n := range nodes {
		switch s := n.StaleDriver; {
		case n.StaleDriverNote != "":
			out = append(out, toned(warn, fmt.Sprintf("%s: stale driver record ignored: %s", n.Name, n.StaleDriverNote)))
		case s != nil && s.StalePods > 0:
			out = append(out, toned(bad, fmt.Sprintf("%s: %s", n.Name, stalePodsText(n))))
		case s != nil && s.Unreadable > 0:
			out = append(out, toned(warn, fmt.Sprintf("%s: %d GPU containers whose maps the NRI plugin may not read: whether they run a deleted driver is unknown", n.Name, s.Unreadable)))
		}
	}
	return out
}
