package precheck

import (
	"fmt"
	"io"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// readFile reads Nodes and Namespaces from file ("-": stdin): a v1 List as
// `kubectl get nodes,ns -o yaml` (or -o json) prints it, or multi-document
// YAML of Nodes, Namespaces and such Lists, within the bounds `mutate` and
// `status pod` read their files in.
func readFile(file string, stdin io.Reader) ([]corev1.Node, []corev1.Namespace, error) {
	objs, err := offline.ReadObjects(file, stdin)
	if err != nil {
		return nil, nil, err
	}
	var c offline.Cluster
	for _, o := range objs {
		switch kind := o.GetKind(); kind {
		case "Node", "Namespace":
		case "":
			return nil, nil, fmt.Errorf("failed to read %s: %s: an object with no kind", file, o.Where)
		default:
			return nil, nil, fmt.Errorf("failed to read %s: %s: a %s, not a Node or a Namespace (kubectl get nodes,ns -o yaml)", file, o.Where, kind)
		}
		if _, err := c.Add(o); err != nil {
			return nil, nil, fmt.Errorf("failed to read %s: %w", file, err)
		}
	}
	namespaces := make([]corev1.Namespace, 0, len(c.Namespaces))
	for name, labels := range c.Namespaces {
		namespaces = append(namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	}
	sort.Slice(namespaces, func(i, j int) bool { return namespaces[i].Name < namespaces[j].Name })
	return c.Nodes, namespaces, nil
}
