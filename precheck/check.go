package precheck

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// Input is what Check decides from: the cluster's Nodes and Namespaces as
// the API server has them, and the webhook's configuration.
type Input struct {
	Nodes      []corev1.Node
	Namespaces []corev1.Namespace
	Config     *config.Configuration
	// ConfigSource says where Config came from, for the report.
	ConfigSource string
	// ReleaseNamespace is where gpu-injector runs, which the webhook never
	// sees; empty when unknown.
	ReleaseNamespace string
	// Clock ages the index's remembered pools; nil: the real clock.
	Clock clock.PassiveClock
}

// labelEnforce is the label Pod Security admission reads on a Namespace.
const labelEnforce = "pod-security.kubernetes.io/enforce"

// nodeNamespace is the namespace of the pod each node is asked about: one
// no configuration excludes, opted in, with no Pod Security level.
const nodeNamespace = "gpu-injector-precheck"

// gpuLabels are labels that mark a node as a GPU node before any probe ran:
// NVIDIA's GPU feature discovery, node-feature-discovery's PCI vendor
// (10de is NVIDIA), and the accelerator labels of GKE, EKS and AKS.
var gpuLabels = []string{
	"nvidia.com/gpu.present", "nvidia.com/gpu.count", "feature.node.kubernetes.io/pci-10de.present",
	"cloud.google.com/gke-accelerator", "k8s.amazonaws.com/accelerator", "kubernetes.azure.com/accelerator",
}

// Check classifies every GPU node and opted-in namespace as the webhook
// would decide their GPU pods: the decision's input is built as the
// webhook builds it (webhook/admitinput, over the node index of
// webhook/gpunodes). The webhook check is left skipped: only a cluster can
// answer it.
func Check(in Input) *Report {
	cfg := in.Config
	if cfg == nil {
		cfg = config.Default()
	}
	r := &Report{Nodes: []NodeCheck{}, Namespaces: []NamespaceCheck{}, Notes: []string{}, Attention: []string{},
		Config:  ConfigCheck{Source: in.ConfigSource, DriverDelivery: string(cfg.DriverDelivery), PodSecurity: string(cfg.PodSecurity), Resources: cfg.Resources.Names},
		Webhook: WebhookCheck{Outcome: WebhookSkipped, Message: "offline: the API server is not asked; run precheck against the cluster to try a dry-run GPU pod"}}
	c := newClassifier(in, cfg)
	for i := range in.Nodes {
		n := &in.Nodes[i]
		evidence := gpuEvidence(n, cfg)
		if evidence == "" {
			continue
		}
		nc := c.node(n)
		nc.Evidence = evidence
		r.Nodes = append(r.Nodes, nc)
	}
	sort.Slice(r.Nodes, func(i, j int) bool { return r.Nodes[i].Name < r.Nodes[j].Name })
	r.DevicePlugin = devicePlugin(r.Nodes, cfg)
	for i := range in.Namespaces {
		ns := &in.Namespaces[i]
		if ns.Labels[layout.LabelInject] != layout.InjectEnabled {
			continue
		}
		r.Namespaces = append(r.Namespaces, c.namespace(ns, r.Nodes, in.ReleaseNamespace))
	}
	sort.Slice(r.Namespaces, func(i, j int) bool { return r.Namespaces[i].Name < r.Namespaces[j].Name })
	return r
}

// classifier asks the webhook's mutation about a GPU pod bound to each node.
type classifier struct {
	cfg *config.Configuration
	// input is the decision's input as the webhook and the offline commands
	// build it, over the nodes and namespaces checked.
	input     *admitinput.Builder
	layoutOf  map[string]*inject.Layout
	rules     layout.Rules
	probeHint string
	nodes     map[string]*corev1.Node
	// decided caches the mutation's answer by what decides it (see key).
	decided map[string]inject.Result
}

func newClassifier(in Input, cfg *config.Configuration) *classifier {
	cl := offline.Cluster{Nodes: make([]corev1.Node, 0, len(in.Nodes)), Namespaces: offline.Namespaces{}}
	for i := range in.Nodes {
		cl.Nodes = append(cl.Nodes, *withAdvertisedGPU(&in.Nodes[i], cfg))
	}
	for i := range in.Namespaces {
		cl.Namespaces[in.Namespaces[i].Name] = in.Namespaces[i].Labels
	}
	// Set last: a cluster's own namespace of that name must not change
	// what every node is asked about, a pod opted in with no Pod Security
	// level.
	cl.Namespaces[nodeNamespace] = map[string]string{layout.LabelInject: layout.InjectEnabled}
	b, _ := cl.Builder(cfg, wallclock.Or(in.Clock), logr.Discard())
	c := &classifier{cfg: cfg, input: b, layoutOf: map[string]*inject.Layout{},
		rules: cfg.Rules(), nodes: make(map[string]*corev1.Node, len(cl.Nodes)), decided: map[string]inject.Result{}}
	for i := range cl.Nodes {
		c.nodes[cl.Nodes[i].Name] = &cl.Nodes[i]
	}
	for _, l := range b.Layouts.Layouts() {
		for _, n := range l.Nodes {
			c.layoutOf[n.Name] = l
		}
	}
	c.probeHint = "kubectl get pods -A -l app.kubernetes.io/name=gpu-injector,app.kubernetes.io/component=nodeprobe -o wide --field-selector spec.nodeName="
	if in.ReleaseNamespace != "" {
		c.probeHint = "kubectl get pods -n " + in.ReleaseNamespace + " -l app.kubernetes.io/name=gpu-injector,app.kubernetes.io/component=nodeprobe -o wide --field-selector spec.nodeName="
	}
	return c
}

// withAdvertisedGPU is n as the index should read it to say how the node's
// pods get the driver: a node that advertises no GPU yet (its device plugin
// is not running) counts one, so that the question has an answer; the
// device plugin check names the node apart.
func withAdvertisedGPU(n *corev1.Node, cfg *config.Configuration) *corev1.Node {
	if _, total := advertised(n, cfg); total > 0 {
		return n
	}
	name := defaultResource(cfg)
	if name == "" {
		return n
	}
	c := n.DeepCopy()
	if c.Status.Allocatable == nil {
		c.Status.Allocatable = corev1.ResourceList{}
	}
	c.Status.Allocatable[corev1.ResourceName(name)] = resource.MustParse("1")
	return c
}

// advertised are the GPU resources the node allocates (of cfg's names),
// sorted, and their sum.
func advertised(n *corev1.Node, cfg *config.Configuration) ([]string, int64) {
	var names []string
	var total int64
	for name, q := range n.Status.Allocatable {
		if v := q.Value(); v > 0 && cfg.IsGPUResource(string(name)) {
			names = append(names, string(name))
			total += v
		}
	}
	sort.Strings(names)
	return names, total
}

// defaultResource is the name a GPU pod asks for by default: nvidia.com/gpu
// when configured, else the first configured name that is no pattern.
func defaultResource(cfg *config.Configuration) string {
	if cfg.IsGPUResource("nvidia.com/gpu") {
		return "nvidia.com/gpu"
	}
	for _, name := range cfg.Resources.Names {
		if !strings.ContainsAny(name, "*?[") && config.IsExtendedResourceName(name) {
			return name
		}
	}
	return ""
}

// gpuEvidence says what makes n a GPU node, "" for none: a probe state
// other than no-driver, GPU capacity, or a GPU label. A node whose probe
// found no NVIDIA device, and nothing else says it has one, is a CPU node.
func gpuEvidence(n *corev1.Node, cfg *config.Configuration) string {
	if s, ok := n.Labels[layout.LabelState]; ok && s != layout.StateNoDriver {
		return layout.LabelState + "=" + s
	}
	for _, list := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
		names := make([]string, 0, len(list))
		for name, q := range list {
			if !q.IsZero() && cfg.IsGPUResource(string(name)) {
				names = append(names, string(name))
			}
		}
		if len(names) > 0 {
			slices.Sort(names)
			q := list[corev1.ResourceName(names[0])]
			return fmt.Sprintf("capacity %s: %s", names[0], q.String())
		}
	}
	for _, k := range gpuLabels {
		if v, ok := n.Labels[k]; ok && v != "false" {
			return k + "=" + v
		}
	}
	return ""
}
