package main

import (
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
)

// gpuNode says whether node i of the cluster is a GPU node, with -gpu-fraction
// f of them spread evenly (with f 0.1, nodes 0, 10, 20, ...), and its number
// among the GPU nodes, or among the CPU nodes if it is not one. The GPU nodes
// of a cluster are the load script's nodes 0, 1, 2, ... whatever f, so a
// cluster of n nodes at f has the GPU nodes of one of n*f nodes at 1.
func gpuNode(i int, f float64) (bool, int) {
	before := gpuNodes(i, f)
	if gpuNodes(i+1, f) > before {
		return true, before
	}
	return false, i - before
}

// gpuNodes is how many of the cluster's first n nodes are GPU nodes: node 0
// is one.
func gpuNodes(n int, f float64) int {
	// The tolerance keeps n*f whole where f is a decimal fraction that
	// float64 does not hold exactly (65,000 * 0.1).
	return int(math.Ceil(float64(n)*f - 1e-9))
}

// clusterNode is node i as a kubelet registers it, the status it then
// reports, and the taints it keeps once Ready.
func (r *run) clusterNode(i int) (*corev1.Node, corev1.NodeStatus, []corev1.Taint) {
	gpu, k := gpuNode(i, r.o.gpuFraction)
	if gpu {
		return r.withPlugin(workload.Node(k)), workload.NodeStatus(k), workload.ReadyNode(k).Spec.Taints
	}
	n, st := cpuNode(k)
	return n, st, nil
}

// cpuNode is CPU node c and its status: a node of the same cluster without
// an NVIDIA device, as the chart's probe (on every node by default) leaves
// it: state no-driver and its reason, and none of NVIDIA's labels, resources
// or taints.
func cpuNode(c int) (*corev1.Node, corev1.NodeStatus) {
	n := workload.Node(c)
	n.Name = fmt.Sprintf("cpu-%05d", c)
	for k := range n.Labels {
		if strings.HasPrefix(k, "nvidia.com/") || strings.HasPrefix(k, layout.Prefix) || k == "feature.node.kubernetes.io/pci-10de.present" {
			delete(n.Labels, k)
		}
	}
	n.Labels[corev1.LabelHostname] = n.Name
	n.Labels[corev1.LabelInstanceTypeStable] = "m7i.24xlarge"
	n.Labels[corev1.LabelInstanceType] = "m7i.24xlarge"
	n.Labels[layout.LabelState] = layout.StateNoDriver
	delete(n.Annotations, layout.AnnotationLayout)
	n.Annotations[layout.AnnotationStateReason] = "NoDriver: no NVIDIA device, kernel module or driver library"
	n.Spec.Taints = n.Spec.Taints[:1]
	st := workload.NodeStatus(c)
	delete(st.Capacity, "nvidia.com/gpu")
	delete(st.Allocatable, "nvidia.com/gpu")
	st.Addresses[1].Address = n.Name
	return n, st
}
