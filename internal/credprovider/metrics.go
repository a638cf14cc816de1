package credprovider

import "github.com/prometheus/client_golang/prometheus"

// Results of asking a provider, the values of the requests metric's result
// label.
const (
	resultCached = "cached"
	resultOK     = "exec"
	resultError  = "error"
)

var (
	execsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_injector_credential_provider_requests_total",
		Help: "Credentials asked of a node's image credential provider plugin, by provider and result: cached (its earlier answer), exec (it ran and answered), error (it failed, was slow, or answered nonsense; the read went on without its credentials).",
	}, []string{"provider", "result"})
	execSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gpu_injector_credential_provider_exec_seconds",
		Help:    "Time an image credential provider plugin ran, by provider.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"provider"})
	cacheEntries = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpu_injector_credential_provider_cache_entries",
		Help: "Answers of an image credential provider plugin cached, by provider.",
	}, []string{"provider"})
)

// Collectors are the keychain's metrics, for the webhook to register.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{execsTotal, execSeconds, cacheEntries}
}
