package nriplugin

import (
	"errors"
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

// registerSocketGauge exports whether the runtime's NRI socket exists, read
// at each scrape. With gpu_injector_nri_registered it tells a node whose
// runtime has no NRI (its pods keep hostPath volumes: nothing to do) from one
// whose runtime has NRI and no plugin registered (a pod marked for the plugin
// that lands there fails to start, or runs without its driver).
func (s *server) registerSocketGauge() error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpu_injector_nri_socket",
		Help: "1 while the container runtime's NRI socket exists on the node, else 0.",
	}, func() float64 {
		if st, err := os.Stat(s.opts.Socket); err == nil && st.Mode()&os.ModeSocket != 0 {
			return 1
		}
		return 0
	})
	if err := s.metrics.registry.Register(g); err != nil {
		// Run again on the same server: the gauge is there already.
		if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
			return err
		}
	}
	return nil
}
