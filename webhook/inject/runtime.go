package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// runtimeDecision is whether the pod's driver comes from the NRI plugin of
// the node it lands on, rather than from hostPath volumes in its spec.
type runtimeDecision struct {
	// pin keeps the pod on nodes whose plugin is registered, when some node
	// it could use has none and hostPath is not an option there.
	pin bool
	// noNode: no known GPU node fits the pod yet (driverDelivery:
	// PreferRuntime), which its warning says.
	noNode bool
	// whyNoNode says why no known node fits, where some GPU node is known.
	whyNoNode string
	// layout is the Result.Layout of a runtime injection; nil when the
	// plugin does not serve the pod, and why says why.
	layout *Layout
	why    noRuntime
	// others counts the layouts the pod can use whose nodes lack the plugin
	// (noRuntimeSomeNodes).
	others int
}

// noRuntime is why the NRI plugin does not serve a pod.
type noRuntime uint8

const (
	runtimeServes noRuntime = iota
	// noRuntimeNames: the target containers' names are not all distinct
	// DNS labels, which the plugin's marker needs.
	noRuntimeNames
	// noRuntimeConfigured: driverDelivery is HostPath.
	noRuntimeConfigured
	// noRuntimeHostPath: the pod already carries the driver as volumes.
	noRuntimeHostPath
	// noRuntimeLegacyKept: its hand-written driver mounts are kept.
	noRuntimeLegacyKept
	// noRuntimePlugin: no layout the pod can use has the plugin on every node.
	noRuntimePlugin
	// noRuntimeNoNode: no ready GPU node fits the pod.
	noRuntimeNoNode
	// noRuntimeSomeNodes: some of the layouts the pod can use have nodes
	// without the plugin, and hostPath volumes are an option.
	noRuntimeSomeNodes
	// noRuntimeRecord: the pod's injection record is unreadable.
	noRuntimeRecord
	// noRuntimeSkip: every node the pod can use injects the driver itself,
	// and runtimeInjection: Skip leaves such pods alone.
	noRuntimeSkip
)

// whyNot says why the NRI plugin does not serve the pod.
func (d runtimeDecision) whyNot() string {
	switch d.why {
	case noRuntimeNames:
		return "its containers' names are not all distinct DNS labels"
	case noRuntimeConfigured:
		return "driverDelivery: " + string(config.DeliveryHostPath)
	case noRuntimeHostPath:
		return "the pod already carries the driver as hostPath volumes"
	case noRuntimeLegacyKept:
		return "its hand-written driver mounts are kept (legacyMounts: " + string(config.LegacyMountsKeep) + ")"
	case noRuntimePlugin:
		return "no GPU node layout the pod can use has gpu-injector's NRI plugin registered on all its nodes (label " + layout.LabelNRIPlugin + "=" + layout.NRIProtocol + ")"
	case noRuntimeNoNode:
		return "no ready GPU node fits the pod"
	case noRuntimeRecord:
		return "the pod's annotation " + layout.AnnotationInjected + " is not one gpu-injector wrote"
	case noRuntimeSkip:
		return "its nodes' own runtime injects the driver (runtimeInjection: " + string(config.RuntimeInjectionSkip) + ")"
	case noRuntimeSomeNodes:
		return fmt.Sprintf("%d of the layouts the pod can use have nodes without gpu-injector's NRI plugin", d.others)
	}
	return ""
}

// runtimeChoice decides between runtime injection and hostPath volumes.
// Runtime injection needs nothing of the node: the node the pod lands on
// mounts its own driver, and sets LD_LIBRARY_PATH from the container's whole
// environment. So driverDelivery: Runtime, which says every GPU node runs the
// plugin, reads no layout at all, and a pod a pool at zero will take is
// admitted before its node exists. A reinvocation keeps the way the pod was
// given its driver.
func (r *request) runtimeChoice() runtimeDecision {
	served := runtimeDecision{layout: &Layout{Runtime: true}}
	if r.prev != nil && r.prev.Runtime != "" {
		served.pin = r.view.Spec.NodeSelector[layout.LabelNRIPlugin] == layout.NRIProtocol
		return served
	}
	if why := r.runtimeRuledOut(); why != runtimeServes {
		return runtimeDecision{why: why}
	}
	if r.cfg.DriverDelivery == config.DeliveryRuntime {
		return served
	}
	return r.preferRuntime(served)
}

// preferRuntime is driverDelivery: PreferRuntime's choice. The pod gets the
// runtime's marker, with no pin, when no known GPU node it can use needs
// hostPath volumes: every such node runs the plugin, or its own runtime (the
// NVIDIA container toolkit, CDI, GKE's device plugin) injects the driver,
// which the plugin leaves to it; or it can use none yet (every pool at zero,
// a node not yet probed). An autoscaler then sees a pod with no pin on a
// label of the probe, and a node of any image or driver may take it: the
// node that lands it delivers its own driver. A known node that only hostPath
// can serve still needs hostPath for the pods that may land there; where only
// some of the nodes the pod can use need hostPath, the pod is pinned to the
// plugin's nodes only when hostPath is no choice (Pod Security).
func (r *request) preferRuntime(served runtimeDecision) runtimeDecision {
	ready, hostPathOnly, nodeRuntime := 0, 0, 0
	for i, l := range r.layouts {
		if r.fit(&r.asIs, i).kind != fits {
			continue
		}
		switch {
		case l.NRIReady():
			ready++
		case l.Plan.RuntimeInjection == "":
			hostPathOnly++
		default:
			nodeRuntime++
		}
	}
	switch {
	case ready == 0 && hostPathOnly == 0 && r.wedgedWhy(r.view, &r.need) != "":
		// The only known nodes it can use have a wedged driver: the layout
		// choice's denial names them.
		return runtimeDecision{why: noRuntimeNoNode}
	case hostPathOnly == 0 && ready == 0 && nodeRuntime > 0 && r.cfg.RuntimeInjection == config.RuntimeInjectionSkip:
		return runtimeDecision{why: noRuntimeSkip}
	case hostPathOnly == 0:
		if served.noNode = ready == 0 && nodeRuntime == 0; served.noNode && len(r.layouts) > 0 {
			_, served.whyNoNode = r.chooseLayout(&r.asIs, nil, false)
		}
		return served
	case ready == 0:
		return runtimeDecision{why: noRuntimePlugin}
	case r.hostPathForbidden():
		served.pin = true
		return served
	}
	return runtimeDecision{why: noRuntimeSomeNodes, others: hostPathOnly}
}

// PolicyServes reports whether, with these layouts and wedged nodes, the
// webhook would answer every pod that the chart's MutatingAdmissionPolicy
// takes as the policy does: the runtime's marker, no pin, no denial. Under
// driverDelivery Runtime it always would; under PreferRuntime while no known
// layout needs hostPath volumes (preferRuntime's hostPathOnly is then zero
// for every pod), none is left alone by runtimeInjection: Skip, and no node's
// driver is wedged, whose pods the webhook denies with the node's reason.
// The policy's answer is a function of the pod alone; this is the cluster's
// half of the bargain, which the webhook's elected replica keeps in the
// policy's parameter (gpunodes.PolicySwitch).
func PolicyServes(cfg *config.Configuration, layouts []*Layout, wedged []*WedgedNode) bool {
	switch cfg.DriverDelivery {
	case config.DeliveryRuntime:
		return true
	case config.DeliveryPreferRuntime:
	default:
		return false
	}
	if len(wedged) > 0 {
		return false
	}
	for _, l := range layouts {
		switch {
		case l.NRIReady():
		case l.Plan.RuntimeInjection == "":
			return false
		case cfg.RuntimeInjection == config.RuntimeInjectionSkip:
			return false
		}
	}
	return true
}

// runtimeRuledOut says why the NRI plugin cannot serve a pod injected for the
// first time before any layout is fitted, runtimeServes if it may.
func (r *request) runtimeRuledOut() noRuntime {
	names := make([]string, 0, len(r.targets))
	for _, ref := range r.targets {
		names = append(names, ref.get(r.view).Name)
	}
	switch {
	case !markable(names):
		// The API server refuses such a pod after admission anyway; a marker
		// the plugin cannot read would only hide why.
		return noRuntimeNames
	case r.cfg.DriverDelivery == config.DeliveryHostPath:
		return noRuntimeConfigured
	case r.prev != nil:
		return noRuntimeHostPath
	case len(r.legacy) > 0 && r.cfg.LegacyMounts == config.LegacyMountsKeep:
		return noRuntimeLegacyKept
	}
	return runtimeServes
}

// markable reports whether containers can be named in a marker the plugin
// reads: DNS labels, each once.
func markable(names []string) bool {
	_, err := layout.ParseRuntimeMarker(layout.FormatRuntimeMarker(names))
	return err == nil
}

// injectRuntime marks the pod for the nodes' NRI plugin: which containers
// get the driver (never what to mount), NRI's required-plugins annotation so
// that a runtime with NRI's default validator does not create them without
// the plugin, and the injection record. No volume, no pin on a layout and no
// LD_LIBRARY_PATH: the node the pod lands on picks its driver, and its plugin
// adds the driver's folders to the container's whole environment, the
// image's included, which the pod's env would override.
func (r *request) injectRuntime(c *change, d runtimeDecision) {
	pod := c.pod
	if len(r.legacy) > 0 {
		replaceLegacy(c, r.legacy, d.layout)
	}
	names := make([]string, 0, len(r.targets))
	for _, ref := range r.targets {
		names = append(names, ref.get(pod).Name)
	}
	marker := layout.FormatRuntimeMarker(names)
	if have, ok := pod.Annotations[layout.AnnotationRuntimeInject]; ok && have != marker {
		c.warn("the pod's annotation %s %q was replaced: only gpu-injector writes it", layout.AnnotationRuntimeInject, layout.Truncate(have, 64))
	}
	if pod.Annotations[layout.AnnotationRuntimeInject] != marker {
		c.do(setAnnotation{key: layout.AnnotationRuntimeInject, value: marker})
	}
	for _, name := range names {
		key, value := requiredPlugins(pod.Annotations, name, c.warn)
		if pod.Annotations[key] != value {
			c.do(setAnnotation{key: key, value: value})
		}
	}
	switch {
	case d.noNode && d.whyNoNode != "":
		c.warn("no ready GPU node fits this pod yet (%s): admitted for a node that will, as an autoscaler adds one for a pool at zero, whose NRI plugin or container toolkit delivers the driver; if it stays Pending, see `gpu-injector status`", d.whyNoNode)
	case d.noNode:
		c.warn("no GPU node is ready yet (every pool at zero?): admitted for the node that takes it, as an autoscaler adds one, whose NRI plugin or container toolkit delivers the driver; if it stays Pending, see `gpu-injector status`")
	}
	if d.pin {
		if have, ok := pod.Spec.NodeSelector[layout.LabelNRIPlugin]; !ok {
			c.do(addNodeSelector{key: layout.LabelNRIPlugin, value: layout.NRIProtocol})
			c.warn("pinned to nodes whose gpu-injector NRI plugin is registered (nodeSelector %s=%s): some GPU nodes this pod could use can only get the driver as hostPath volumes, which are not an option here; an autoscaler adds a node for this pod only if its node template carries that label",
				layout.LabelNRIPlugin, layout.NRIProtocol)
		} else if have != layout.NRIProtocol {
			c.warn("pod's nodeSelector %s=%s conflicts with the runtime injection's %s=%s; kept the pod's", layout.LabelNRIPlugin, have, layout.LabelNRIPlugin, layout.NRIProtocol)
		}
	}
	record := layout.Injected{Runtime: layout.InjectedByNRI, Containers: names}.String()
	if pod.Annotations[layout.AnnotationInjected] != record {
		c.do(setAnnotation{key: layout.AnnotationInjected, value: record})
	}
}

// maxNameInKey is the longest container name that fits NRI's
// container-scoped key: the part after the prefix's "/" is at most 63
// characters, "container." takes 10.
const maxNameInKey = 63 - len("container.")

// requiredPlugins is the NRI required-plugins annotation for a container,
// with gpu-injector added to whatever the pod already requires of it, in
// the precedence NRI reads (container-scoped, then pod-scoped, then the bare
// key). A name too long for a key falls back on the pod-scoped key, which
// requires the plugin for every container of the pod: it is registered for
// all of them or for none.
func requiredPlugins(annotations map[string]string, container string, warn func(string, ...any)) (string, string) {
	base := layout.AnnotationNRIRequiredPlugins
	key := base + "/container." + container
	lookup := []string{key, base + "/pod", base}
	if len(container) > maxNameInKey {
		key, lookup = base+"/pod", lookup[1:]
	}
	var list []string
	for _, k := range lookup {
		v, ok := annotations[k]
		if !ok {
			continue
		}
		// NRI reads the value as YAML, and so does this.
		if err := yaml.Unmarshal([]byte(v), &list); err != nil {
			warn("annotation %s %q is not a list of plugin names; replaced by the plugins gpu-injector requires", k, layout.Truncate(v, 64))
			list = nil
		}
		break
	}
	if !slices.Contains(list, layout.NRIPluginName) {
		list = append(list, layout.NRIPluginName)
	}
	b, _ := json.Marshal(list)
	return key, strings.TrimSpace(string(b))
}
