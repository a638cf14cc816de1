//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// podCandidate is a pod, or the pod template of a workload, found in a
// manifest. Name and Namespace are the object's own: a template rarely has a
// name, and `gpu-injector mutate` works on whole workloads.
type podCandidate struct {
	Kind      string
	Name      string
	Namespace string
	Meta      metav1.ObjectMeta
	Spec      corev1.PodSpec
}

// maxManifestBytes bounds what podsim reads; a mutated workload is a few KiB.
const maxManifestBytes = 16 << 20

// readCandidates returns every pod and workload pod template in a YAML or JSON
// stream of documents, in order, looking into List items.
func readCandidates(r io.Reader) ([]podCandidate, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read manifest: %w", err)
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("failed to read manifest: larger than %d bytes", maxManifestBytes)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []podCandidate
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("failed to read manifest document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		found, err := candidatesOf(doc)
		if err != nil {
			return nil, fmt.Errorf("failed to decode manifest document %d: %w", i, err)
		}
		out = append(out, found...)
	}
	return out, nil
}

func candidatesOf(doc []byte) ([]podCandidate, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("failed to read kind: %w", err)
	}
	switch tm.Kind {
	case "Pod":
		var o corev1.Pod
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode Pod: %w", err)
		}
		return []podCandidate{{Kind: tm.Kind, Name: o.Name, Namespace: o.Namespace, Meta: o.ObjectMeta, Spec: o.Spec}}, nil
	case "Job":
		var o batchv1.Job
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode Job: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.Template)}, nil
	case "CronJob":
		var o batchv1.CronJob
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode CronJob: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.JobTemplate.Spec.Template)}, nil
	case "Deployment":
		var o appsv1.Deployment
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode Deployment: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.Template)}, nil
	case "StatefulSet":
		var o appsv1.StatefulSet
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode StatefulSet: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.Template)}, nil
	case "DaemonSet":
		var o appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode DaemonSet: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.Template)}, nil
	case "ReplicaSet":
		var o appsv1.ReplicaSet
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("failed to decode ReplicaSet: %w", err)
		}
		return []podCandidate{fromTemplate(tm.Kind, o.ObjectMeta, o.Spec.Template)}, nil
	case "List", "PodList", "JobList", "DeploymentList":
		var l struct {
			Items []jsonRaw `json:"items"`
		}
		if err := yaml.Unmarshal(doc, &l); err != nil {
			return nil, fmt.Errorf("failed to decode %s: %w", tm.Kind, err)
		}
		var out []podCandidate
		for i, item := range l.Items {
			found, err := candidatesOf(item)
			if err != nil {
				return nil, fmt.Errorf("failed to decode item %d: %w", i, err)
			}
			out = append(out, found...)
		}
		return out, nil
	}
	// Other kinds (Services, ConfigMaps, ...) may share the stream; they hold no pod.
	return nil, nil
}

// jsonRaw keeps a List item undecoded; sigs.k8s.io/yaml hands it JSON.
type jsonRaw []byte

func (r *jsonRaw) UnmarshalJSON(b []byte) error {
	*r = append((*r)[:0], b...)
	return nil
}

func fromTemplate(kind string, owner metav1.ObjectMeta, t corev1.PodTemplateSpec) podCandidate {
	meta := t.ObjectMeta
	if meta.Name == "" {
		meta.Name = owner.Name
	}
	if meta.Namespace == "" {
		meta.Namespace = owner.Namespace
	}
	return podCandidate{Kind: kind, Name: owner.Name, Namespace: owner.Namespace, Meta: meta, Spec: t.Spec}
}

// selectCandidate picks the candidate named name, or the first when name is empty.
func selectCandidate(cands []podCandidate, name string) (podCandidate, error) {
	if len(cands) == 0 {
		return podCandidate{}, fmt.Errorf("no Pod or workload pod template in the manifest")
	}
	if name == "" {
		return cands[0], nil
	}
	var names []string
	for _, c := range cands {
		if c.Name == name {
			return c, nil
		}
		names = append(names, c.Kind+"/"+c.Name)
	}
	return podCandidate{}, fmt.Errorf("no Pod or workload named %q in the manifest (found %v)", name, names)
}

// selectContainer picks the container named name (init containers too), or
// the first app container when name is empty.
func selectContainer(spec *corev1.PodSpec, name string) (*corev1.Container, error) {
	if name == "" {
		if len(spec.Containers) == 0 {
			return nil, fmt.Errorf("the pod has no containers")
		}
		return &spec.Containers[0], nil
	}
	var names []string
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i], nil
		}
		names = append(names, spec.Containers[i].Name)
	}
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == name {
			return &spec.InitContainers[i], nil
		}
		names = append(names, spec.InitContainers[i].Name)
	}
	return nil, fmt.Errorf("no container named %q in the pod (found %v)", name, names)
}
