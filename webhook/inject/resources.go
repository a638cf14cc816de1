package inject

import (
	"iter"
	"slices"
	"strconv"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
)

// GPUResources are the GPU resources a node offers: each name of its
// allocatable that resources.names matches, with its count when above 0, and
// under the empty name the GPUs that DRA ResourceSlices publish for it (which
// resource names those serve is not known per node). A pod is only matched
// with a node that offers what it requests: in a cluster whose MIG nodes and
// whole-GPU nodes publish different layouts, a pod asking for
// nvidia.com/mig-1g.10gb must not be pinned to the whole-GPU nodes' layout,
// where the scheduler would never place it.
//
// The set is kept as one interned string ("name\tcount\n" per entry, sorted
// by name; the zero value is the empty set): the nodes of a pool offer the
// same few names and counts, so they share one copy and each node holds a
// pointer, where a map per node would cost hundreds of bytes at tens of
// thousands of nodes.
type GPUResources struct{ h unique.Handle[string] }

// DRAResource is the entry of the GPUs DRA ResourceSlices publish.
const DRAResource = ""

// unknownResources counts, in Layout.Offered, the nodes that offer no GPU
// resource yet; no resource name has a tab.
const unknownResources = "\tunknown"

// GPUResource is one entry of a GPUResources.
type GPUResource struct {
	Name  string
	Count int64
}

// value is the encoded set, "" for the empty one.
func (r GPUResources) value() string {
	if r.h == (unique.Handle[string]{}) {
		return ""
	}
	return r.h.Value()
}

// All yields the entries in the order of their names.
func (r GPUResources) All() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for line := range strings.SplitSeq(r.value(), "\n") {
			name, count, ok := strings.Cut(line, "\t")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(count, 10, 64)
			if !yield(name, n) {
				return
			}
		}
	}
}

// Has reports whether the set holds the name; it does not parse counts, as
// a request checks this for many nodes.
func (r GPUResources) Has(name string) bool {
	// By hand rather than through an iterator: this runs for each node a
	// request checks, and must not allocate.
	v := r.value()
	for v != "" {
		line := v
		if i := strings.IndexByte(v, '\n'); i >= 0 {
			line, v = v[:i], v[i+1:]
		} else {
			v = ""
		}
		if n, _, ok := strings.Cut(line, "\t"); ok && n == name {
			return true
		}
	}
	return false
}

// appendGPUResources encodes entries, which must be sorted by name and have
// counts above 0.
func appendGPUResources(b []byte, entries []GPUResource) []byte {
	for _, e := range entries {
		b = append(b, e.Name...)
		b = append(b, '\t')
		b = strconv.AppendInt(b, e.Count, 10)
		b = append(b, '\n')
	}
	return b
}

// MakeGPUResources interns the entries (sorted by name, counts above 0);
// old is returned when it holds them already, so that a status update
// neither allocates nor interns.
func MakeGPUResources(entries []GPUResource, old GPUResources) GPUResources {
	if len(entries) == 0 {
		return GPUResources{}
	}
	var buf [128]byte
	b := appendGPUResources(buf[:0], entries)
	if string(b) == old.value() {
		return old
	}
	return GPUResources{unique.Make(string(b))}
}

// WithDRA is r with its DRA entry set to gpus (none for 0).
func (r GPUResources) WithDRA(gpus int64) GPUResources {
	var entries []GPUResource
	if gpus > 0 {
		entries = append(entries, GPUResource{Name: DRAResource, Count: gpus})
	}
	for name, n := range r.All() {
		if name != DRAResource {
			entries = append(entries, GPUResource{Name: name, Count: n})
		}
	}
	return MakeGPUResources(entries, r)
}

// ValidResourceName keeps names out that would break the encoding; the API
// server admits no such resource name, but a --nodes file is not checked.
func ValidResourceName(name string) bool {
	return name != DRAResource && !strings.ContainsAny(name, "\t\n")
}

// gpuNeed is what a pod asks of a node's GPU resources: the GPU resource
// names its containers request (after the legacy rename), and the extended
// resource names that GPU DeviceClasses serve, which a node whose GPUs come
// through DRA offers.
type gpuNeed struct {
	names []string
	dra   []string
}

// requestedGPUResources lists the GPU resources the pod's containers and
// init containers request (limits or requests above 0), sorted: what the
// scheduler will look for on a node.
func (r *request) requestedGPUResources(pod *corev1.Pod) gpuNeed {
	need := gpuNeed{dra: r.gpuResources}
	for _, ref := range containerRefs(pod) {
		c := ref.get(pod)
		for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for name, q := range rl {
				if !q.IsZero() && r.isGPU(name) && !slices.Contains(need.names, string(name)) {
					need.names = append(need.names, string(name))
				}
			}
		}
	}
	slices.Sort(need.names)
	return need
}

// servedByDRA reports whether a node whose GPUs come through DRA offers the
// name: a GPU DeviceClass serves it. Which class's devices a node has is not
// kept, so such a node is taken to offer every name a GPU class serves.
func (nd *gpuNeed) servedByDRA(name string) bool { return slices.Contains(nd.dra, name) }

// nodeLacks returns the requested names the node does not offer, nil when
// it offers them all.
func (nd *gpuNeed) nodeLacks(r GPUResources) []string {
	if r.value() == "" {
		// Nothing known yet: the probe can publish before the device plugin
		// registers (a node just up, the GPU operator still starting). Such
		// a node stays a candidate: the pod waits Pending for the plugin
		// instead of being denied.
		return nil
	}
	var missing []string
	for _, name := range nd.names {
		if r.Has(name) || (nd.servedByDRA(name) && r.Has(DRAResource)) {
			continue
		}
		missing = append(missing, name)
	}
	return missing
}

// layoutLacks returns the requested names that no node of the layout offers.
func (nd *gpuNeed) layoutLacks(l *Layout) []string {
	offered := l.Offered()
	if offered[unknownResources] > 0 {
		// A node that offers nothing yet may offer anything (nodeLacks).
		return nil
	}
	var missing []string
	for _, name := range nd.names {
		if offered[name] > 0 || (nd.servedByDRA(name) && offered[DRAResource] > 0) {
			continue
		}
		missing = append(missing, name)
	}
	return missing
}

// gpus is what the layout policy weighs a layout by for this pod: its GPUs of
// the requested names (a MIG pod goes where most of its MIG slices are, not
// where most whole GPUs are), or all its GPUs for a pod that requests no GPU
// resource by name (it claims its GPUs through DRA) and for a remembered
// layout, whose nodes are gone.
func (nd *gpuNeed) gpus(l *Layout) int64 {
	if len(nd.names) == 0 || l.Remembered != nil {
		return l.AllocatableGPUs
	}
	offered := l.Offered()
	var sum int64
	for _, name := range nd.names {
		sum += offered[name]
		if nd.servedByDRA(name) {
			sum += offered[DRAResource]
		}
	}
	return sum
}

// describeResources names resources in a message: "a", "a and b".
func describeResources(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// Offered sums the layout's GPUs per resource name, built on first use from
// Nodes, which a published Layout never changes. The nodes of a pool share
// one set, so each distinct set is read once. Nodes that offer no GPU
// resource yet are counted under a key no resource name has.
func (l *Layout) Offered() map[string]int64 {
	l.offeredOnce.Do(func() {
		perSet := map[GPUResources]int64{}
		for _, n := range l.Nodes {
			perSet[n.GPUs]++
		}
		out := map[string]int64{}
		if n := perSet[GPUResources{}]; n > 0 {
			out[unknownResources] = n
		}
		for set, nodes := range perSet {
			for name, n := range set.All() {
				out[name] += n * nodes
			}
		}
		l.offeredGPUs = out
	})
	return l.offeredGPUs
}
