package offline

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

// Cluster is what files say of a cluster: its Nodes, the labels of its
// Namespaces, its DRA objects and the data of its pool memory.
type Cluster struct {
	Nodes []corev1.Node
	// Namespaces are the labels of each Namespace given, by name.
	Namespaces Namespaces
	// DRA are ResourceSlices, DeviceClasses, ResourceClaims and
	// ResourceClaimTemplates.
	DRA []client.Object
	// Memory is the data of the pool memory's ConfigMap; MemoryName names
	// it, empty when none was given.
	Memory     map[string]string
	MemoryName string
}

// ClusterKinds are the kinds a file of the cluster may hold, for the
// messages that refuse another.
const ClusterKinds = "a Node, a Namespace, a DRA object or the pool memory's ConfigMap"

// AddFile reads the objects of file, "-" for stdin: every one must be a
// Node, a Namespace, a DRA object or a ConfigMap, which is taken as the
// pool memory.
func (c *Cluster) AddFile(file string, stdin io.Reader) error {
	objs, err := ReadObjects(file, stdin)
	if err != nil {
		return err
	}
	for _, o := range objs {
		ok, err := c.Add(o)
		if err != nil {
			return fmt.Errorf("failed to read %s: %w", file, err)
		}
		if !ok {
			return fmt.Errorf("failed to read %s: %s is a %q, not %s", file, o.Where, o.GetKind(), ClusterKinds)
		}
	}
	return nil
}

// ReadObjects reads the objects of file, "-" for stdin, within MaxFileBytes
// and MaxObjects.
func ReadObjects(file string, stdin io.Reader) ([]Object, error) {
	data, err := ReadFile(file, stdin)
	if err != nil {
		return nil, err
	}
	objs, err := DecodeObjects(data)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", file, err)
	}
	return objs, nil
}

// DecodeObjects are the objects of a YAML or JSON stream, within
// MaxObjects; every document must decode.
func DecodeObjects(data []byte) ([]Object, error) {
	docs, _, err := SplitDocuments(data)
	if err != nil {
		return nil, err
	}
	maps, errs := Decode(docs)
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	return Objects(maps)
}

// Add records o if it is a Node, a Namespace, a DRA object or a ConfigMap,
// taken as the pool memory, and says whether it was one.
func (c *Cluster) Add(o Object) (bool, error) {
	switch kind := o.GetKind(); {
	case kind == "Node":
		var n corev1.Node
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &n); err != nil {
			return true, fmt.Errorf("%s: invalid Node: %w", o.Where, err)
		}
		c.Nodes = append(c.Nodes, n)
	case kind == "Namespace":
		var ns corev1.Namespace
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ns); err != nil {
			return true, fmt.Errorf("%s: invalid Namespace: %w", o.Where, err)
		}
		if ns.Name == "" {
			return true, fmt.Errorf("%s: a Namespace without a name", o.Where)
		}
		if c.Namespaces == nil {
			c.Namespaces = Namespaces{}
		}
		c.Namespaces[ns.Name] = ns.Labels
	case gpunodes.IsDRAKind(kind):
		obj := gpunodes.NewDRAObject(kind)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, obj); err != nil {
			return true, fmt.Errorf("%s: invalid %s: %w", o.Where, kind, err)
		}
		c.DRA = append(c.DRA, obj)
	case kind == "ConfigMap":
		return true, c.addMemory(o)
	default:
		return false, nil
	}
	return true, nil
}

// addMemory records the ConfigMap o as the pool memory; a second one is an
// error.
func (c *Cluster) addMemory(o Object) error {
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm); err != nil {
		return fmt.Errorf("%s: invalid ConfigMap: %w", o.Where, err)
	}
	if c.MemoryName != "" {
		return fmt.Errorf("%s: ConfigMap %s is a second pool memory, after %s", o.Where, cm.Name, c.MemoryName)
	}
	c.Memory, c.MemoryName = cm.Data, cm.Name
	if cm.Namespace != "" {
		c.MemoryName = cm.Namespace + "/" + cm.Name
	}
	return nil
}

// Namespaces are the labels of the Namespaces given, by name; a namespace
// not given has none, and the Pod Security level of its pods is not
// checked, as when the webhook cannot read it.
type Namespaces map[string]map[string]string

// NamespaceLabels implements admitinput.NamespaceLabeler.
func (n Namespaces) NamespaceLabels(_ context.Context, name string) (map[string]string, error) {
	return n[name], nil
}

// Builder is the decision's input over the cluster, as the webhook's
// caches would hold it: the Nodes in a node index, with the pool memory
// and the GPUs the ResourceSlices publish, the DRA objects, the
// Namespaces' labels. The notes say what of the cluster keeps its nodes
// from lending a layout, for the user. clk ages the remembered pools.
func (c *Cluster) Builder(cfg *config.Configuration, clk clock.PassiveClock, log logr.Logger) (*admitinput.Builder, []string) {
	idx := gpunodes.NewIndex(cfg, log)
	idx.SetClock(clk)
	notes := c.memory(idx, cfg, clk)
	dra := gpunodes.NewDRA(cfg, idx, nil, log)
	for _, o := range c.DRA {
		dra.Add(o)
	}
	for i := range c.Nodes {
		idx.Update(&c.Nodes[i])
	}
	notes = append(notes, nodeNotes(c.Nodes, idx, cfg)...)
	b := &admitinput.Builder{Config: cfg, Layouts: idx, DRA: dra, Offline: true}
	if c.Namespaces != nil {
		b.Namespaces = c.Namespaces
	}
	return b, notes
}

// memory hands the index the pool memory, and says which of its entries
// the webhook would ignore.
func (c *Cluster) memory(idx *gpunodes.Index, cfg *config.Configuration, clk clock.PassiveClock) []string {
	if c.MemoryName == "" {
		return nil
	}
	if !cfg.Pinning.ByPool() {
		return []string{fmt.Sprintf("the pool memory %s is unused: pinning.nodeLabels is empty", c.MemoryName)}
	}
	mem, errs := pools.DecodeMemory(c.Memory, cfg.Pinning.NodeLabels, cfg.Rules(), clk.Now())
	idx.SetMemory(mem)
	if len(errs) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("the pool memory %s: %d entries ignored: %v", c.MemoryName, len(errs), errors.Join(errs...))}
}
