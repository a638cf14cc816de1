package server

import (
	"bytes"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
)

// decodePod decodes the request's object into a whole Pod, as the API
// machinery decodes it, and refuses what a JSON Patch cannot edit: an
// absent or null metadata or spec, where every edit's path starts, and a null
// container, which a typed Pod would read as an empty one.
func decodePod(raw []byte) (*corev1.Pod, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, errors.New("the request has no object")
	}
	var o podObject
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, &o); err != nil {
		return nil, err
	}
	return o.pod()
}

// podObject is a Pod whose metadata, spec and containers are pointers, so
// that a missing or null one can be told apart; its own fields of those
// names are shadowed and stay empty.
type podObject struct {
	corev1.Pod
	Metadata *metav1.ObjectMeta `json:"metadata"`
	Spec     *struct {
		corev1.PodSpec
		InitContainers      []*corev1.Container          `json:"initContainers"`
		Containers          []*corev1.Container          `json:"containers"`
		EphemeralContainers []*corev1.EphemeralContainer `json:"ephemeralContainers"`
	} `json:"spec"`
}

// errNoMetadataOrSpec: a JSON Patch cannot reach into a null or absent
// metadata or spec.
var errNoMetadataOrSpec = errors.New("the pod has no metadata or no spec")

func (o *podObject) pod() (*corev1.Pod, error) {
	if o.Metadata == nil || o.Spec == nil {
		return nil, errNoMetadataOrSpec
	}
	pod := &o.Pod
	pod.ObjectMeta, pod.Spec = *o.Metadata, o.Spec.PodSpec
	var err error
	if pod.Spec.InitContainers, err = notNull(o.Spec.InitContainers, "initContainers"); err != nil {
		return nil, err
	}
	if pod.Spec.Containers, err = notNull(o.Spec.Containers, "containers"); err != nil {
		return nil, err
	}
	if pod.Spec.EphemeralContainers, err = notNull(o.Spec.EphemeralContainers, "ephemeralContainers"); err != nil {
		return nil, err
	}
	return pod, nil
}

// notNull copies a list of pointers into a list of values; nil stays nil.
func notNull[T any](in []*T, list string) ([]T, error) {
	if in == nil {
		return nil, nil
	}
	out := make([]T, len(in))
	for i, c := range in {
		if c == nil {
			return nil, fmt.Errorf("%s[%d] is null", list, i)
		}
		out[i] = *c
	}
	return out, nil
}
