package podstatus

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// Files stand in for the API server: the pods of a file, and the cluster
// beside them, in that file and in others.
type Files struct {
	// Name is the pods' file, for messages.
	Name string
	Pods []*corev1.Pod
	// Cluster are the Nodes, Namespaces, DRA objects and pool memory of
	// the files.
	Cluster offline.Cluster
	// Config is the configuration; nil is the defaults.
	Config *config.Configuration
}

// ReadFiles reads the pods of file, with the cluster objects beside them
// (Nodes, Namespaces, DRA objects, the pool memory's ConfigMap), and the
// cluster of clusterFiles, each within the bounds of package offline.
func ReadFiles(file string, clusterFiles []string) (*Files, error) {
	objs, err := offline.ReadObjects(file, nil)
	if err != nil {
		return nil, err
	}
	f := &Files{Name: file}
	for _, o := range objs {
		if o.GetKind() == "Pod" {
			pod := &corev1.Pod{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, pod); err != nil {
				return nil, fmt.Errorf("failed to read %s: %s: invalid Pod: %w", file, o.Where, err)
			}
			f.Pods = append(f.Pods, pod)
			continue
		}
		ok, err := f.Cluster.Add(o)
		if err != nil {
			return nil, fmt.Errorf("failed to read %s: %w", file, err)
		}
		if !ok {
			return nil, fmt.Errorf("failed to read %s: %s is a %q, not a Pod, %s", file, o.Where, o.GetKind(), offline.ClusterKinds)
		}
	}
	if len(f.Pods) == 0 {
		return nil, fmt.Errorf("failed to read %s: it holds no Pod", file)
	}
	for _, cf := range clusterFiles {
		if err := f.Cluster.AddFile(cf, nil); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Only is the namespace and name of the file's one pod; false when it
// holds more than one.
func (f *Files) Only() (string, string, bool) {
	if len(f.Pods) != 1 {
		return "", "", false
	}
	return podNamespace(f.Pods[0]), f.Pods[0].Name, true
}

// podNamespace is the pod's namespace, "default" for a manifest that names
// none, as kubectl applies it.
func podNamespace(p *corev1.Pod) string {
	if p.Namespace == "" {
		return "default"
	}
	return p.Namespace
}
