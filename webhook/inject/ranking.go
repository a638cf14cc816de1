package inject

// Nodes publish their own layout, state and allocatable GPUs, and a node's
// credentials can write all three: a compromised node can claim any count
// for a layout of its own. What the layout choice weighs is therefore what
// one node cannot inflate alone: a layout counts only once enough nodes
// publish it (config ranking.minNodes), and a node counts for at most
// ranking.maxGPUsPerNode GPUs whatever it reports.

// nodeSet counts a layout's nodes by what they offer, so that a request
// weighs a layout of thousands of nodes by its few distinct sets.
type nodeSet struct {
	gpus        GPUResources
	allocatable int64
	nodes       int64
}

// nodeSets groups the layout's nodes by their GPU resources and allocatable
// GPUs, built on first use from Nodes, which a published Layout never
// changes.
func (l *Layout) nodeSets() []nodeSet {
	l.setsOnce.Do(func() {
		type key struct {
			gpus        GPUResources
			allocatable int64
		}
		at := map[key]int{}
		for _, n := range l.Nodes {
			k := key{n.GPUs, n.AllocatableGPUs}
			i, ok := at[k]
			if !ok {
				i = len(l.sets)
				at[k] = i
				l.sets = append(l.sets, nodeSet{gpus: n.GPUs, allocatable: n.AllocatableGPUs})
			}
			l.sets[i].nodes++
		}
	})
	return l.sets
}

// established reports whether enough nodes publish the layout for the
// policy to weigh it against others. A remembered layout is its pool's
// last, which live layouts already outrank.
func (r *request) established(l *Layout) bool {
	return l.Remembered != nil || len(l.Nodes) >= r.cfg.Ranking.MinNodes
}

// rankGPUs is what the policy weighs a layout by for this pod: as
// gpuNeed.gpus, with each node counted for at most ranking.maxGPUsPerNode.
func (r *request) rankGPUs(l *Layout) int64 {
	if l.Remembered != nil {
		return r.need.gpus(l)
	}
	limit := r.cfg.Ranking.MaxGPUsPerNode
	claims := len(r.need.names) == 0 && len(r.gpuClaims) > 0
	var sum int64
	for _, s := range l.nodeSets() {
		sum += min(r.need.nodeGPUs(s, claims), limit) * s.nodes
	}
	return sum
}

// nodeGPUs is gpus for one node of the set: its GPUs of the requested names;
// for a pod that requests none by name, its DRA GPUs when the pod claims
// its GPUs (claims), else all its GPUs.
func (nd *gpuNeed) nodeGPUs(s nodeSet, claims bool) int64 {
	if len(nd.names) == 0 && !claims {
		return s.allocatable
	}
	if len(nd.names) == 0 {
		for name, n := range s.gpus.All() {
			if name == DRAResource {
				return n
			}
		}
		return 0
	}
	var sum, dra int64
	for name, n := range s.gpus.All() {
		if name == DRAResource {
			dra = n
		}
	}
	for name, n := range s.gpus.All() {
		for _, want := range nd.names {
			if name == want {
				sum += n
			}
		}
	}
	for _, want := range nd.names {
		if nd.servedByDRA(want) {
			sum += dra
		}
	}
	return max(sum, 0)
}
