package nodeprobe

import (
	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// noteStaleDriver keeps the NRI plugin's last scan for deleted driver
// libraries as the annotation value to publish: only while the plugin is
// registered, since a record of a plugin that stopped is no longer true.
func (d *daemon) noteStaleDriver(log logr.Logger, p *statedir.Plugin, up bool) {
	value := ""
	if up && p != nil && p.StaleDriver != nil {
		v, err := layout.EncodeStaleDriver(*p.StaleDriver)
		if err != nil {
			log.Error(err, "failed to encode the nri plugin's stale driver record")
		} else {
			value = v
		}
	}
	if old := d.staleDriverValue(); old != value && value != "" {
		if s := p.StaleDriver; s.StalePods > 0 {
			log.Info("gpu pods on a deleted driver", "stalePods", s.StalePods, "pods", s.Pods)
		}
	}
	d.staleDriver.Store(value)
}

func (d *daemon) staleDriverValue() string {
	v, _ := d.staleDriver.Load().(string)
	return v
}

// withStaleDriver adds layout.AnnotationStaleDriver to p while the plugin has
// a record; Publish removes it otherwise.
func (d *daemon) withStaleDriver(p Published) Published {
	v := d.staleDriverValue()
	if v == "" {
		return p
	}
	annotations := make(map[string]string, len(p.Annotations)+1)
	for k, val := range p.Annotations {
		annotations[k] = val
	}
	annotations[layout.AnnotationStaleDriver] = v
	p.Annotations = annotations
	return p
}
