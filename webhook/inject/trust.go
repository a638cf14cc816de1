package inject

import (
	"slices"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// Whoever writes a pod writes its annotations, gpu-injector's marker and
// record included. Neither decides policy on the author's word: a record of
// a runtime injection is believed only when the rest of the pod agrees with
// it, a record that cannot be read does not end the decision early, and a
// marker gpu-injector did not write is taken out.

// believeRuntimeRecord reports whether a record of a runtime injection is
// one gpu-injector could have written on this pod, in this configuration:
// driverDelivery allows runtime injection, the marker names the record's
// containers, those are the pod's target containers, and NRI's
// required-plugins annotation requires gpu-injector's plugin for each. A
// record that is not is the pod author's, and the pod is decided afresh.
func (r *request) believeRuntimeRecord(prev *layout.Injected) bool {
	if r.cfg.DriverDelivery == config.DeliveryHostPath || len(prev.Volumes) > 0 || prev.Fingerprint != "" || prev.StaticLayout != "" {
		return false
	}
	ann := r.view.Annotations
	if marker, ok := ann[layout.AnnotationRuntimeInject]; !ok || marker != layout.FormatRuntimeMarker(prev.Containers) {
		return false
	}
	names := make([]string, 0, len(r.targets))
	for _, ref := range r.targets {
		names = append(names, ref.get(r.view).Name)
	}
	if !slices.Equal(names, prev.Containers) {
		return false
	}
	for _, name := range names {
		key, value := requiredPlugins(ann, name, func(string, ...any) {})
		if ann[key] != value {
			return false
		}
	}
	return true
}

// distrustRecord drops a runtime record the pod does not bear out: the pod
// is decided as one never injected, and the record is rewritten by the
// injection or taken out (dropRecord).
func (r *request) distrustRecord() {
	if r.prev == nil || r.prev.Runtime == "" || r.believeRuntimeRecord(r.prev) {
		return
	}
	r.prev, r.forged = nil, true
}

// unreadableRecord decides on a pod whose record gpu-injector cannot read:
// without it, which volumes, mounts and selector are gpu-injector's is
// unknown, and injecting again could stack a second driver on the first, so
// the pod gets no driver. The rest of the decision still holds: the marker
// goes, and where Pod Security forbids hostPath and podSecurity is Deny, the
// pod is denied like any other that cannot get the driver.
func (r *request) unreadableRecord() decision {
	_, marked := r.view.Annotations[layout.AnnotationRuntimeInject]
	d := decision{reason: reasonUnreadableRecord, dropMarker: marked, runtime: runtimeDecision{why: noRuntimeRecord}}
	if r.hostPathForbidden() && r.cfg.PodSecurity == config.PodSecurityDeny {
		d.deny(reasonPodSecurity)
		return d
	}
	d.warn("the pod's annotation %s is not one gpu-injector wrote (%v); the pod is left as it is. Remove the annotation to have the driver injected (and the %s* volumes, their mounts and the %s selector, if gpu-injector's earlier injection is still in the pod)",
		layout.AnnotationInjected, r.prevErr, volumePrefix, layout.LabelFingerprint)
	return r.withoutDriver(d)
}
