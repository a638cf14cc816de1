package imageconfig

import "github.com/prometheus/client_golang/prometheus"

// Results of a read, the values of the reads metric's result label.
const (
	resultHit       = "hit"
	resultMiss      = "miss"
	resultError     = "error"
	resultNotListed = "not-listed"
)

var (
	readsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_injector_image_config_reads_total",
		Help: "Reads of an image's configuration at admission, by result: hit (cache), miss (read from the registry), error (registry down, slow past the budget, refusing, or answer unusable; the pod admitted without it), not-listed (registry not in images.registries).",
	}, []string{"result"})
	readSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpu_injector_image_config_read_seconds",
		Help:    "Time an admission waited for an image's configuration that was not cached, at most the budget.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	registrySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "gpu_injector_image_config_registry_seconds",
		Help:    "Time a registry took to answer a read of an image's configuration, past the budget too.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	cacheEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpu_injector_image_config_cache_entries",
		Help: "Images whose configuration is cached, by digest.",
	})
	cacheBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpu_injector_image_config_cache_bytes",
		Help: "Estimated bytes of the cached images' configuration.",
	})
)

func init() {
	for _, r := range []string{resultHit, resultMiss, resultError, resultNotListed} {
		readsTotal.WithLabelValues(r)
	}
}

// Collectors are the reader's metrics, for the webhook to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{readsTotal, readSeconds, registrySeconds, cacheEntries, cacheBytes}
}
