// Package inject is gpu-injector's pure injection: from a pod, the candidate
// driver layouts (and the nodes that publish them) and the configuration, it
// decides whether to inject, which layout, and returns the edits, the JSON
// Patch and the warnings. It talks to no cluster: the admission server
// (package server) and the offline `gpu-injector mutate` both call Mutate,
// and the node index (package gpunodes) builds the candidates it is handed.
package inject

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

// NodeInfo is what the mutation needs of a Node: the index keeps only this.
type NodeInfo struct {
	Name   string
	Labels Labels
	Taints []corev1.Taint
	// AllocatableGPUs sums the node's allocatable GPU resources.
	AllocatableGPUs int64
	// GPUs are the GPU resources the node offers, by name (interned).
	GPUs GPUResources

	// Pool is the node's pool key with pinning.nodeLabels, "" for none; the
	// node index computes it once per change so its pool view does not
	// rebuild it.
	Pool string
}

// WedgedNode is a node whose probe marked its NVIDIA driver wedged
// (layout.StateWedged) and that is otherwise ready and schedulable: it lends
// no layout, but a pod no layout fits is told when it could have used it.
type WedgedNode struct {
	Node *NodeInfo
	// Reason is the node's state-reason (its probe's condition and message),
	// cut short and stripped of control characters: text a node publishes
	// that reaches a user's denial.
	Reason string
}

// Layout is one candidate driver layout and the ready nodes that publish it.
type Layout struct {
	// Fingerprint is the plan's fingerprint; empty for a static layout.
	Fingerprint string
	Plan        layout.Plan
	// Static names the configuration's static layout this came from.
	Static string
	// NodeSelector is injected with a static layout instead of the fingerprint.
	NodeSelector map[string]string
	// AllocatableGPUs sums the nodes' allocatable GPUs.
	AllocatableGPUs int64
	Nodes           []*NodeInfo

	// Pool is set when pods are pinned by pool labels (config pinning.nodeLabels)
	// and every ready node of the pool publishes this layout: NodeSelector then
	// holds the pool's labels, which the autoscaler knows. Pools whose nodes
	// all publish one layout are one choice: Pool then joins their keys
	// (pools.Join), PoolLabels holds each pool's labels, and the pod is pinned
	// by a required node affinity over all of them, so that the scheduler
	// and an autoscaler may use any of them (spot and on-demand pools of one
	// node image).
	Pool       string
	PoolLabels []map[string]string
	// Remembered is set on the layout a pool published last, kept while the
	// pool has no node; Nodes then holds one node that stands for the pool's
	// next one (the labels and taints every node of the pool had).
	Remembered *Remembered
	// MixedPools are pools whose ready nodes publish more than one layout (an
	// upgrade under way): their nodes of this layout are pinned by fingerprint.
	MixedPools []string

	// Runtime marks the Result.Layout of a pod injected at the runtime: no
	// plan of its own (each node's NRI plugin mounts that node's), only the
	// library folders of the layouts the pod may land on.
	Runtime bool

	// lookup is built on first use from Nodes, which never change once a
	// Layout is published: the index publishes a new Layout instead.
	lookupOnce sync.Once
	lookup     *nodeLookup
	// mounts is built on first use from Plan, which a published Layout
	// never changes either.
	mountsOnce sync.Once
	mounts     []preparedMount
	// offeredGPUs sums Nodes' GPUs per resource name, built on first use.
	offeredOnce sync.Once
	offeredGPUs map[string]int64
	// nriReady: every node of Nodes has its NRI plugin registered, counted
	// on first use.
	nriOnce  sync.Once
	nriReady bool
	// sets are Nodes grouped by what they offer, built on first use.
	setsOnce sync.Once
	sets     []nodeSet
}

// NRIReady reports whether every node of the layout injects at the runtime
// through gpu-injector's NRI plugin (layout.LabelNRIPlugin), so a pod may
// land on any of them with no hostPath volume. A layout that some other
// runtime injection serves (Plan.RuntimeInjection) is not: the plugin leaves
// those nodes' containers to it.
func (l *Layout) NRIReady() bool {
	l.nriOnce.Do(func() {
		if l.Plan.RuntimeInjection != "" || len(l.Nodes) == 0 {
			return
		}
		for _, n := range l.Nodes {
			if n.Labels.Get(layout.LabelNRIPlugin) != layout.NRIProtocol {
				return
			}
		}
		l.nriReady = true
	})
	return l.nriReady
}

// preparedMount is what every pod of a layout gets for one of the plan's
// mounts, built once per Layout rather than per request: the volume's name
// (a hash), the volume and a read-only mount of it, and both as the JSON the
// patch carries. A name that must change to avoid a user's volume is built
// per request instead (see freeVolumeNames).
type preparedMount struct {
	mount  layout.Mount
	volume corev1.Volume
	use    corev1.VolumeMount
	// volumeJSON and useJSON hold a json.RawMessage, boxed once.
	volumeJSON, useJSON any
}

func (l *Layout) preparedMounts() []preparedMount {
	l.mountsOnce.Do(func() {
		l.mounts = make([]preparedMount, len(l.Plan.Mounts))
		for i, mt := range l.Plan.Mounts {
			pm := &l.mounts[i]
			pm.mount = mt
			pm.volume = hostPathVolume(mt)
			pm.volume.Name = volumeName(mt)
			pm.use = readOnlyUse(pm.volume.Name, mt.ContainerPath)
			// A Volume and a VolumeMount always encode.
			v, _ := json.Marshal(pm.volume)
			u, _ := json.Marshal(pm.use)
			pm.volumeJSON, pm.useJSON = json.RawMessage(v), json.RawMessage(u)
		}
	})
	return l.mounts
}

// nodeLookup answers "could any node of this layout match?" without a scan.
type nodeLookup struct {
	byName map[string]*NodeInfo
	labels map[string]map[string]struct{}
}

func (l *Layout) nodeLookup() *nodeLookup {
	l.lookupOnce.Do(func() {
		lk := &nodeLookup{byName: make(map[string]*NodeInfo, len(l.Nodes)), labels: map[string]map[string]struct{}{}}
		for _, n := range l.Nodes {
			lk.byName[n.Name] = n
			for k, v := range n.Labels.All() {
				vals := lk.labels[k]
				if vals == nil {
					vals = map[string]struct{}{}
					lk.labels[k] = vals
				}
				vals[v] = struct{}{}
			}
		}
		l.lookup = lk
	})
	return l.lookup
}

// Remembered says when a pool's remembered layout was last seen on a node,
// and which of the layout's pools at zero the configuration declares.
type Remembered struct {
	// LastSeen is zero where every pool is declared.
	LastSeen time.Time
	// Until is when the memory expires (LastSeen + pinning.rememberFor).
	Until time.Time
	// Declared are the keys of the pools served from pinning.pools, which
	// never expire.
	Declared []string
}

// Decision is what the mutation did with a pod.
type Decision string

const (
	// DecisionInjected: the pod was changed (driver injected and/or legacy
	// resource renamed).
	DecisionInjected Decision = "Injected"
	// DecisionSkipped: the pod was left unchanged; Reason says why.
	DecisionSkipped Decision = "Skipped"
	// DecisionDenied: the pod must be rejected, and was left unchanged;
	// Reason is the user's message.
	DecisionDenied Decision = "Denied"
)

// Skip reasons, also the values of the skipped-by-reason metric label.
const (
	ReasonNoGPU             = "no-gpu"
	ReasonOptOut            = "opt-out"
	ReasonExcludedNamespace = "excluded-namespace"
	ReasonAlreadyInjected   = "already-injected"
	ReasonNoLayout          = "no-layout"
	// ReasonRuntimeInjection: the chosen layout's runtime injects the driver
	// and the configuration says to leave such pods alone.
	ReasonRuntimeInjection = "runtime-injection"
	// ReasonAdmittedByPolicy: the pod carries the label of the chart's
	// MutatingAdmissionPolicy (layout.LabelAdmission), which the webhook's
	// objectSelector leaves out.
	ReasonAdmittedByPolicy = "admitted-by-policy"
)

// Input is everything the mutation decides from.
type Input struct {
	Pod *corev1.Pod
	// NamespaceLabels of the pod's namespace; nil when unknown (offline).
	NamespaceLabels map[string]string
	// Layouts are the ready probed layouts; the mutation adds static ones.
	Layouts []*Layout
	// Wedged are the nodes whose driver is wedged, sorted by name; they lend
	// no layout, and a pod no layout fits is told which of them it could use.
	Wedged []*WedgedNode
	// Seed drives the Spread policy's weighted choice: the same seed gives
	// the same layout, so the answer stays a function of the input.
	Seed uint64
	// GPUResources are more extended resource names that make a container a
	// GPU container: those GPU DeviceClasses serve (DRA).
	GPUResources []string
	// GPUClaims name the pod's spec.resourceClaims entries that request a
	// GPU DeviceClass; a container that uses one is a GPU container.
	GPUClaims []string
	// Images are what the registries said of the target containers' images,
	// by the image as a container names it; an image missing here is
	// unknown, and the pod is read alone, as when images are not read.
	Images map[string]*ImageConfig
	// ImagesUnread are the images whose configuration could not be read,
	// with the registry's answer, in the order the pod names them: a pod
	// injected carries them (layout.AnnotationImagesUnread), so that
	// `gpu-injector status` can list it; none removes an earlier record.
	ImagesUnread []layout.ImageUnread
}

// ImageConfig is what the mutation reads of an image's configuration, as
// its registry said.
type ImageConfig struct {
	// Env is the configuration's Env, NAME=VALUE, in its order.
	Env []string
	// Labels are the configuration's labels.
	Labels map[string]string

	// need is what the image's own ENV requires of the driver's CUDA
	// version, parsed on first use: the webhook keeps one ImageConfig per
	// cached image, so each is parsed once, not on every admission.
	needOnce sync.Once
	need     imageNeed
}

// imageNeed is the Gt threshold of an image's NVIDIA_REQUIRE_CUDA and its
// value, gt 0 when it requires nothing steerable.
type imageNeed struct {
	gt    int
	value string
}

func (c *ImageConfig) cudaNeed() imageNeed {
	c.needOnce.Do(func() { c.need.gt, c.need.value = envCUDANeed(c.Env) })
	return c.need
}

// Getenv is the image's value of an environment variable, as a process
// started from it sees it: the last entry of that name.
func (c *ImageConfig) Getenv(key string) (string, bool) {
	for i := len(c.Env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(c.Env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// Result is the mutation's answer. Input.Pod is changed in place when the
// Decision is Injected, and left as it came otherwise.
type Result struct {
	// Edits are the changes made to the pod, in order; Patch holds the JSON
	// Patch operations that make them on the pod's JSON. Both are empty
	// unless Decision is Injected.
	Edits []Edit
	Patch []jsonpatch.Operation

	Decision Decision
	// Reason is a skip reason constant, or the denial message.
	Reason   string
	Warnings []string
	// Layout is the layout injected, if any.
	Layout *Layout
}
