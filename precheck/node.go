package precheck

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// node is one GPU node's check: its probe's row as `gpu-injector status`
// reads it, and the delivery the webhook gives a GPU pod bound to it.
func (c *classifier) node(orig *corev1.Node) NodeCheck {
	st, _ := status.NodeStatusOf(orig, c.cfg)
	_, gpus := advertised(orig, c.cfg)
	nc := NodeCheck{Name: orig.Name, State: st.State, DriverVersion: st.DriverVersion, Fingerprint: st.Fingerprint,
		NRIPlugin: st.NRIPlugin, Runtime: st.Runtime, AllocatableGPUs: gpus, Delivery: DeliveryNone, NeedsAttention: true}
	reason := ""
	if st.Reason != "" {
		reason = ": " + st.Reason
	}
	switch st.State {
	case "":
		nc.Why = fmt.Sprintf("not probed (no %s label): check the probe DaemonSet's pod on it, %s%s (no pod: the DaemonSet's nodeSelector, affinity or tolerations leave the node out)",
			layout.LabelState, c.probeHint, orig.Name)
	case layout.StateNoDriver:
		nc.Why = "its probe found no NVIDIA driver on the node" + reason
	case layout.StateError:
		nc.Why = "its probe's state is error" + reason
	case layout.StateWedged:
		nc.Why = "its driver is wedged (only a GPU reset or a reboot helps)" + reason
	case layout.StateReady:
		c.ready(&nc, c.nodes[orig.Name])
	default:
		nc.Why = fmt.Sprintf("its probe's state %q is none the webhook knows", st.State)
	}
	return nc
}

// ready classifies a node whose probe found a driver: one the index lends
// a layout from is asked of the mutation; any other says why it lends none.
func (c *classifier) ready(nc *NodeCheck, n *corev1.Node) {
	l := c.layoutOf[n.Name]
	switch {
	case l != nil:
		c.deliver(nc, n, l, c.decide(n, l, nodeNamespace))
	case n.Spec.Unschedulable:
		nc.Why, nc.NeedsAttention = "cordoned: it lends no layout until it is uncordoned", false
	case !gpunodes.NodeReady(n):
		nc.Why = "the node is not Ready: it lends no layout until the kubelet reports Ready"
	default:
		ann, has := n.Annotations[layout.AnnotationLayout]
		_, reason, err := gpunodes.CheckPublished(ann, has, n.Labels[layout.LabelFingerprint], c.rules)
		if err == nil {
			nc.Why = "the webhook's index lends no layout from it"
			return
		}
		nc.Why = fmt.Sprintf("the webhook ignores the layout it publishes (%s): %s", reason, layout.OneLine(err.Error(), 300))
	}
}

// decide is the webhook's answer for the dry run's GPU pod bound to n
// (tolerating every taint), in namespace ns. Nodes of one layout that offer
// the same resource and plugin get the same answer: it is asked once for
// them.
func (c *classifier) decide(n *corev1.Node, l *inject.Layout, ns string) inject.Result {
	names, _ := advertised(n, c.cfg)
	res := defaultResource(c.cfg)
	if len(names) > 0 && !slices.Contains(names, res) {
		res = names[0]
	}
	key := strings.Join([]string{l.Fingerprint, l.Pool, n.Labels[layout.LabelNRIPlugin], res, ns}, "\x00")
	if got, ok := c.decided[key]; ok {
		return got
	}
	pod := status.DryRunPod()
	pod.GenerateName, pod.Name, pod.Namespace = "", "gpu-injector-precheck", ns
	pod.Spec.NodeName = n.Name
	pod.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	if res != "" {
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}
	}
	// The node's name seeds the Spread policy, so that a node's answer is
	// the same on every run.
	got := c.input.Decide(context.Background(), pod, ns, types.UID(n.Name))
	c.decided[key] = got
	return got
}

// deliver reads the mutation's answer for a pod bound to the node.
func (c *classifier) deliver(nc *NodeCheck, n *corev1.Node, l *inject.Layout, res inject.Result) {
	nc.NeedsAttention = false
	runtime := l.Plan.RuntimeInjection
	switch {
	case res.Decision == inject.DecisionInjected && res.Layout != nil && res.Layout.Runtime:
		c.deliverMarked(nc, runtime)
	case res.Decision == inject.DecisionInjected && res.Layout != nil && res.Layout.Plan.RuntimeInjection != "":
		nc.Delivery = DeliveryNodeRuntime
		nc.Why = fmt.Sprintf("its own runtime injects the driver (layout runtimeInjection: %s): the pod is pinned to layout %s, with no volume", runtime, l.Fingerprint)
	case res.Decision == inject.DecisionInjected && res.Layout != nil:
		nc.Delivery = DeliveryHostPath
		nc.Why = fmt.Sprintf("%s: read-only hostPath volumes of layout %s (driver %s), pinned to it; needs Pod Security privileged",
			c.hostPathWhy(n, l), l.Fingerprint, l.Plan.DriverVersion)
	case res.Decision == inject.DecisionSkipped && res.Reason == inject.ReasonRuntimeInjection:
		nc.Delivery = DeliveryNodeRuntime
		nc.Why = fmt.Sprintf("left to its own runtime (layout runtimeInjection: %s; runtimeInjection: %s)", runtime, config.RuntimeInjectionSkip)
	case res.Decision == inject.DecisionDenied:
		nc.NeedsAttention = true
		nc.Why = "the webhook would deny its GPU pods: " + strings.TrimPrefix(res.Reason, inject.WarnPrefix)
	default:
		nc.NeedsAttention = true
		nc.Why = "the webhook would admit its GPU pods without the driver (" + res.Reason + ")"
		if len(res.Warnings) > 0 {
			nc.Why += ": " + strings.TrimPrefix(res.Warnings[0], inject.WarnPrefix)
		}
	}
}

// deliverMarked is a pod marked for gpu-injector's NRI plugin: the plugin
// mounts the driver where it is registered; elsewhere the node's own
// runtime must, or nothing does.
func (c *classifier) deliverMarked(nc *NodeCheck, runtime string) {
	switch {
	case nc.NRIPlugin == layout.NRIProtocol:
		nc.Delivery = DeliveryNRI
		nc.Why = fmt.Sprintf("gpu-injector's NRI plugin is registered (%s=%s): it mounts the node's driver as the container is created; the pod gets a marker, no volume, no pin",
			layout.LabelNRIPlugin, layout.NRIProtocol)
	case runtime != "":
		nc.Delivery = DeliveryNodeRuntime
		nc.Why = fmt.Sprintf("marked for gpu-injector's NRI plugin, which the node does not run: its own runtime injects the driver (layout runtimeInjection: %s)", runtime)
	default:
		nc.NeedsAttention = true
		nc.Why = fmt.Sprintf("marked for gpu-injector's NRI plugin (driverDelivery: %s), which is not registered on the node (no %s=%s): its GPU containers are refused by the runtime's NRI validator, or run without the driver",
			c.cfg.DriverDelivery, layout.LabelNRIPlugin, layout.NRIProtocol)
	}
}

// hostPathWhy says why the NRI plugin does not serve the node's pods.
func (c *classifier) hostPathWhy(n *corev1.Node, l *inject.Layout) string {
	v := n.Labels[layout.LabelNRIPlugin]
	switch {
	case c.cfg.DriverDelivery == config.DeliveryHostPath:
		return "driverDelivery: " + string(config.DeliveryHostPath)
	case v == "":
		return fmt.Sprintf("no NRI plugin registered (no %s label)", layout.LabelNRIPlugin)
	case v != layout.NRIProtocol:
		return fmt.Sprintf("its NRI plugin speaks %q, not %s", v, layout.NRIProtocol)
	case !l.NRIReady():
		return fmt.Sprintf("other nodes of layout %s have no NRI plugin registered", l.Fingerprint)
	}
	return "the webhook chose hostPath volumes"
}
