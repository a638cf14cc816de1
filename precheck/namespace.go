package precheck

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// namespace checks an opted-in namespace's Pod Security level against what
// its GPU pods need on each GPU node: the webhook is asked about a pod bound
// to each node there, and a node where the pod would be denied, or given
// hostPath volumes the level forbids, is one the namespace refuses.
func (c *classifier) namespace(ns *corev1.Namespace, nodes []NodeCheck, release string) NamespaceCheck {
	nc := NamespaceCheck{Name: ns.Name, Enforce: ns.Labels[labelEnforce]}
	nc.Excluded = ns.Name == release || slices.Contains(c.cfg.ExcludedNamespaces, ns.Name)
	if nc.Excluded || (nc.Enforce != "baseline" && nc.Enforce != "restricted") {
		return nc
	}
	for _, n := range nodes {
		l := c.layoutOf[n.Name]
		if n.Delivery == DeliveryNone || l == nil {
			continue
		}
		res := c.decide(c.nodes[n.Name], l, ns.Name)
		short, why := refusal(res, nc.Enforce)
		if why == "" {
			continue
		}
		nc.Refused = append(nc.Refused, n.Name)
		if nc.Message == "" {
			nc.Reason, nc.Message = short, why
		}
	}
	return nc
}

// refusal says why a GPU pod the webhook answered res for cannot run in a
// namespace enforcing level, in short and in the webhook's words; "" when
// it can.
func refusal(res inject.Result, level string) (string, string) {
	switch {
	case res.Decision == inject.DecisionDenied:
		return "the webhook denies them", "the webhook denies it: " + strings.TrimPrefix(res.Reason, inject.WarnPrefix)
	case res.Decision != inject.DecisionInjected || res.Layout == nil || res.Layout.Runtime || len(res.Layout.Plan.Mounts) == 0:
		return "", ""
	}
	short := "their hostPath volumes need Pod Security privileged"
	for _, w := range res.Warnings {
		if strings.Contains(w, "the API server will reject this pod") {
			return short, strings.TrimPrefix(w, inject.WarnPrefix)
		}
	}
	return short, fmt.Sprintf("Pod Security %q refuses the hostPath volumes the webhook injects", level)
}

// devicePlugin counts the GPU nodes that advertise allocatable GPUs.
func devicePlugin(nodes []NodeCheck, cfg *config.Configuration) DevicePluginCheck {
	d := DevicePluginCheck{Resources: cfg.Resources.Names}
	for _, n := range nodes {
		if n.AllocatableGPUs > 0 {
			d.Advertising++
		} else {
			d.Without = append(d.Without, n.Name)
		}
	}
	return d
}
