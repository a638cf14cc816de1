package webhook

import (
	"bytes"
	"errors"
	"fmt"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// decodePod reads from a pod's JSON only what Mutate reads: names, the
// annotations and labels, each container's resources, env and mounts, the volumes'
// names and hostPaths, and what decides where the pod may land. The rest of
// a large pod (commands, probes, images, managedFields, other volume
// sources) is skipped by the scanner instead of built into Go values, which
// is most of the webhook's time on a large pod. Lists keep their length and
// order, so an edit's index is also its place in the JSON.
//
// A field Mutate starts to read must be added here too:
// TestDecodePodMatchesFullDecode runs every golden case through both
// decoders and fails when the results differ.
func decodePod(raw []byte) (*corev1.Pod, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, errors.New("the request has no object")
	}
	var p slimPod
	if err := unmarshal(raw, &p); err != nil {
		return nil, err
	}
	return p.pod()
}

// unmarshal decodes as the API machinery does (sigs.k8s.io/json: names are
// case-sensitive, so "NodeName" is not nodeName; a repeated name keeps its
// last value, and a null after a value leaves a string or number as it was;
// invalid UTF-8 is accepted), in one pass: encoding/json
// validates the whole input before it decodes it, and skips what it does not
// keep byte by byte, which made it 1.8 to 2.3 times slower on the load
// script's pods (BenchmarkDecodePod). go-json-experiment/json is the Go
// team's encoding/json/v2 outside the standard library.
func unmarshal(raw []byte, v any) error {
	return jsonv2.Unmarshal(raw, v, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true), jsonv1.MergeWithLegacySemantics(true))
}

// errNoMetadataOrSpec: a JSON Patch cannot reach into a null or absent
// metadata or spec, where every edit's path starts.
var errNoMetadataOrSpec = errors.New("the pod has no metadata or no spec")

// pod is the typed pod with what the decoder read.
func (p *slimPod) pod() (*corev1.Pod, error) {
	// Every edit's path starts at one of these.
	if p.Metadata == nil || p.Spec == nil {
		return nil, errNoMetadataOrSpec
	}
	pod := &corev1.Pod{}
	m, s := p.Metadata, p.Spec
	pod.Name, pod.GenerateName, pod.Namespace, pod.Annotations = m.Name, m.GenerateName, m.Namespace, m.Annotations
	// The labels' count decides whether the pool pinning label is added to
	// the map or as the whole map.
	pod.Labels = m.Labels
	pod.Spec.NodeName, pod.Spec.NodeSelector, pod.Spec.Tolerations = s.NodeName, s.NodeSelector, s.Tolerations
	// Which claims are GPUs is read from their templates or claims (DRA).
	pod.Spec.ResourceClaims = s.ResourceClaims
	if s.Affinity != nil && s.Affinity.NodeAffinity != nil {
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: s.Affinity.NodeAffinity}
	}
	if s.Volumes != nil {
		pod.Spec.Volumes = make([]corev1.Volume, len(s.Volumes))
		for i, v := range s.Volumes {
			pod.Spec.Volumes[i] = corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{HostPath: v.HostPath}}
		}
	}
	var err error
	if pod.Spec.InitContainers, err = containers(s.InitContainers, "initContainers"); err != nil {
		return nil, err
	}
	if pod.Spec.Containers, err = containers(s.Containers, "containers"); err != nil {
		return nil, err
	}
	if s.EphemeralContainers != nil {
		cs, err := containers(s.EphemeralContainers, "ephemeralContainers")
		if err != nil {
			return nil, err
		}
		pod.Spec.EphemeralContainers = make([]corev1.EphemeralContainer, len(cs))
		for i := range cs {
			pod.Spec.EphemeralContainers[i].EphemeralContainerCommon = corev1.EphemeralContainerCommon(cs[i])
		}
	}
	return pod, nil
}

func containers(in []*slimContainer, list string) ([]corev1.Container, error) {
	if in == nil {
		return nil, nil
	}
	out := make([]corev1.Container, len(in))
	for i, c := range in {
		if c == nil {
			return nil, fmt.Errorf("%s[%d] is null", list, i)
		}
		out[i] = corev1.Container{
			Name:         c.Name,
			VolumeMounts: c.VolumeMounts,
			Resources:    corev1.ResourceRequirements{Limits: c.Resources.Limits, Requests: c.Resources.Requests, Claims: c.Resources.Claims},
		}
		if c.EnvFrom != nil {
			out[i].EnvFrom = make([]corev1.EnvFromSource, len(c.EnvFrom))
		}
		if c.Env != nil {
			out[i].Env = make([]corev1.EnvVar, len(c.Env))
			for j, e := range c.Env {
				out[i].Env[j] = corev1.EnvVar{Name: e.Name, Value: e.Value}
				if e.ValueFrom != nil {
					// Only its presence matters: the value is the kubelet's.
					out[i].Env[j].ValueFrom = &corev1.EnvVarSource{}
				}
			}
		}
	}
	return out, nil
}

type slimPod struct {
	Metadata *struct {
		Name         string            `json:"name"`
		GenerateName string            `json:"generateName"`
		Namespace    string            `json:"namespace"`
		Annotations  map[string]string `json:"annotations"`
		Labels       map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec *struct {
		InitContainers      []*slimContainer          `json:"initContainers"`
		Containers          []*slimContainer          `json:"containers"`
		EphemeralContainers []*slimContainer          `json:"ephemeralContainers"`
		Volumes             []slimVolume              `json:"volumes"`
		NodeName            string                    `json:"nodeName"`
		NodeSelector        map[string]string         `json:"nodeSelector"`
		Tolerations         []corev1.Toleration       `json:"tolerations"`
		ResourceClaims      []corev1.PodResourceClaim `json:"resourceClaims"`
		Affinity            *struct {
			NodeAffinity *corev1.NodeAffinity `json:"nodeAffinity"`
		} `json:"affinity"`
	} `json:"spec"`
}

type slimContainer struct {
	Name      string `json:"name"`
	Resources struct {
		Limits   map[corev1.ResourceName]resource.Quantity `json:"limits"`
		Requests map[corev1.ResourceName]resource.Quantity `json:"requests"`
		Claims   []corev1.ResourceClaim                    `json:"claims"`
	} `json:"resources"`
	Env []struct {
		Name      string    `json:"name"`
		Value     string    `json:"value"`
		ValueFrom *struct{} `json:"valueFrom"`
	} `json:"env"`
	// Only whether there are any matters.
	EnvFrom      []struct{}           `json:"envFrom"`
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
}

type slimVolume struct {
	Name     string                       `json:"name"`
	HostPath *corev1.HostPathVolumeSource `json:"hostPath"`
}
