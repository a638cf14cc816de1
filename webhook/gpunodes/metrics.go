package gpunodes

import "github.com/prometheus/client_golang/prometheus"

// Reasons a published layout is ignored, the values of the rejected metric's label.
const (
	RejectDecode      = "decode"
	RejectInvalid     = "invalid"
	RejectFingerprint = "fingerprint"
	// RejectMemory: a remembered pool layout in the memory ConfigMap.
	RejectMemory = "memory"
)

// The index's metrics; the admission server registers them (Collectors)
// next to its own, so a program that links the index without the server
// registers nothing.
var (
	layoutsRejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_injector_layouts_rejected_total",
		Help: "Node layout annotations ignored, by reason (decode, invalid, fingerprint), and remembered pool layouts ignored (memory); counted once per change of a node's layout.",
	}, []string{"reason"})
	layoutsKnown = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpu_injector_layouts",
		Help: "Distinct driver layouts published by ready, schedulable nodes.",
	})
	layoutNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpu_injector_layout_nodes",
		Help: "Ready, schedulable nodes publishing each layout, by fingerprint.",
	}, []string{"fingerprint"})
	poolLayouts = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpu_injector_pools",
		Help: "GPU pools (with pinning.nodeLabels), by pool and state: live (every ready node publishes one layout; pods are pinned by the pool's labels), mixed (pinned by fingerprint), remembered (no node; the last layout serves until it expires) or declared (no node and nothing remembered; config.pinning.pools serves it). Always 1.",
	}, []string{"pool", "state"})
	wedgedNodes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpu_injector_wedged_nodes",
		Help: "Ready, schedulable nodes whose probe marked the NVIDIA driver wedged (state wedged): they get no GPU pods.",
	})
	mismatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpu_injector_layout_mismatches_total",
		Help: "Pods pinned by pool that landed on a node publishing another layout (each got a LayoutMismatch Event).",
	})
)

func init() {
	// Pre-create the label values so dashboards see zeros, not gaps.
	for _, r := range []string{RejectDecode, RejectInvalid, RejectFingerprint, RejectMemory} {
		layoutsRejected.WithLabelValues(r)
	}
}

// Collectors are the index's metrics, for the server to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{layoutsRejected, layoutsKnown, layoutNodes, poolLayouts, wedgedNodes, mismatches}
}
