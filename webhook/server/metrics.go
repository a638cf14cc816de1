package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/gpu-injector/gpu-injector/internal/credprovider"
	"github.com/gpu-injector/gpu-injector/internal/imageconfig"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// The domain metrics sit on controller-runtime's registry so that one scrape
// of the metrics endpoint shows them next to controller_runtime_webhook_*:
// the admission's own and the node index's.
var (
	podsInjected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpu_injector_pods_injected_total",
		Help: "GPU pods the webhook changed.",
	})
	podsSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_injector_pods_skipped_total",
		Help: "Pods admitted unchanged, by reason.",
	}, []string{"reason"})
	podsDenied = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpu_injector_pods_denied_total",
		Help: "GPU pods denied because no driver layout fits them or their namespace forbids hostPath.",
	})
	buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpu_injector_build_info",
		Help: "Always 1; the label says which build runs.",
	}, []string{"version"})
)

func init() {
	metrics.Registry.MustRegister(podsInjected, podsSkipped, podsDenied, buildInfo)
	metrics.Registry.MustRegister(gpunodes.Collectors()...)
	metrics.Registry.MustRegister(imageconfig.Collectors()...)
	metrics.Registry.MustRegister(credprovider.Collectors()...)
	// Pre-create the label values so dashboards see zeros, not gaps.
	for _, r := range []string{inject.ReasonNoGPU, inject.ReasonOptOut, inject.ReasonExcludedNamespace, inject.ReasonAlreadyInjected, inject.ReasonNoLayout, inject.ReasonRuntimeInjection, inject.ReasonAdmittedByPolicy} {
		podsSkipped.WithLabelValues(r)
	}
}

// SetBuildInfo publishes the running version.
func SetBuildInfo(version string) {
	buildInfo.Reset()
	buildInfo.WithLabelValues(version).Set(1)
}
