package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var admissionsBusy = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "gpu_injector_admissions_busy_total",
	Help: "Admission requests answered 429 because --max-in-flight admissions were running.",
})

func init() {
	metrics.Registry.MustRegister(admissionsBusy)
}

// Defaults of the admission bounds; the API server waits for an answer at
// most the webhook configuration's timeoutSeconds (30 at most).
const (
	// DefaultMaxInFlight admissions run at once per replica; a mutation takes
	// a millisecond, so more than this waiting means a flood, not a load.
	DefaultMaxInFlight = 64
	// DefaultReadTimeout is how long a request's body may take to arrive
	// once its headers have: the API server sends it at once.
	DefaultReadTimeout = 10 * time.Second
	// queueWait is how long a request waits for a free slot before it is
	// answered busy.
	queueWait = time.Second
)

// bounded runs next for at most maxInFlight requests at once, each of whose
// bodies must arrive within readTimeout. A request that finds no slot within
// queueWait (or whose caller gives up first) is answered 429 with
// Retry-After: the API server applies the webhook's failurePolicy to it,
// and the replica's memory stays bounded by maxInFlight requests of at most
// maxReviewSize, whatever arrives.
func bounded(next http.Handler, maxInFlight int, readTimeout time.Duration) http.Handler {
	slots := make(chan struct{}, maxInFlight)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The headers are in (controller-runtime's server bounds their
		// read); the body must follow. Not every writer supports deadlines
		// (a test's recorder), which leaves the request unbounded in time
		// only there.
		// wallclock: a connection deadline is an instant of the real clock.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(readTimeout))
		select {
		case slots <- struct{}{}:
		default:
			t := time.NewTimer(queueWait)
			defer t.Stop()
			select {
			case slots <- struct{}{}:
			case <-r.Context().Done():
				return
			case <-t.C:
				admissionsBusy.Inc()
				w.Header().Set("Retry-After", strconv.Itoa(1))
				http.Error(w, busyMessage(maxInFlight), http.StatusTooManyRequests)
				return
			}
		}
		defer func() { <-slots }()
		next.ServeHTTP(w, r)
	})
}

// busyMessage is what the API server reports of a busy replica, under the
// webhook's failurePolicy: what to change if it is not a passing flood.
func busyMessage(maxInFlight int) string {
	return "gpu-injector: this replica already runs " + strconv.Itoa(maxInFlight) +
		" admissions (--max-in-flight); create the pod again, and if this persists add replicas (chart value webhook.replicas) or raise the bound (webhook.extraArgs: [--max-in-flight=N])"
}
