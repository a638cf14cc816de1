package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
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
	// libs are the library folders of the layouts the pod may land on, for
	// LD_LIBRARY_PATH: the plan of the node decides the files, not the folders.
	libs []string
	// layout is the Result.Layout of a runtime injection; nil when the
	// driver goes in as hostPath volumes.
	layout *Layout
	// why says why runtime injection was not chosen.
	why string
}

// noPluginWhy is why a pod no layout with the plugin can take gets hostPath.
const noPluginWhy = "no GPU node layout the pod can use has gpu-injector's NRI plugin registered on all its nodes (label " + layout.LabelNRIPlugin + "=" + layout.NRIProtocol + ")"

// runtimeChoice decides between runtime injection and hostPath volumes.
// Runtime injection needs no pin: the node the pod lands on mounts its own
// driver, so it is chosen outright when every layout the pod can use is
// served by registered plugins. Where only some are, the pod is pinned to
// those only when hostPath is no choice (Pod Security, or driverDelivery:
// Runtime): a pin on a label of the probe is one an autoscaler does not know.
func (m matcher) runtimeChoice(pod *corev1.Pod, targets []containerRef, layouts []*Layout, prev *layout.Injected, forbidsHostPath bool, legacy []legacyMount, renamed []corev1.ResourceName, need *gpuNeed) runtimeDecision {
	cfg := m.cfg
	again := prev != nil && prev.Runtime != ""
	names := make([]string, 0, len(targets))
	for _, ref := range targets {
		names = append(names, ref.get(pod).Name)
	}
	switch {
	case !again && !markable(names):
		// The API server refuses such a pod after admission anyway; a marker
		// the plugin cannot read would only hide why.
		return runtimeDecision{why: "its containers' names are not all distinct DNS labels"}
	case again:
		// A reinvocation: the pod keeps the way it was given its driver.
	case cfg.DriverDelivery == config.DeliveryHostPath:
		return runtimeDecision{why: "driverDelivery: " + config.DeliveryHostPath}
	case prev != nil:
		return runtimeDecision{why: "the pod already carries the driver as hostPath volumes"}
	case len(legacy) > 0 && cfg.LegacyMounts == config.LegacyMountsKeep:
		return runtimeDecision{why: "its hand-written driver mounts are kept (legacyMounts: " + config.LegacyMountsKeep + ")"}
	}
	if !again && !slices.ContainsFunc(layouts, (*Layout).NRIReady) {
		// Most clusters: no node runs the plugin, so no layout needs the
		// pod's constraints checked a second time on every request.
		return runtimeDecision{why: noPluginWhy}
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	var match *affinityNode
	if hasRequiredAffinity(pod) {
		match = newAffinityNode(pod)
	}
	var ready []*Layout
	others := 0
	for _, l := range layouts {
		if layoutFit(pod, l, affinity, match, renamed, need) != "" {
			continue
		}
		if l.NRIReady() {
			ready = append(ready, l)
		} else {
			others++
		}
	}
	d := runtimeDecision{layout: &Layout{Runtime: true}}
	for _, l := range ready {
		for _, p := range l.Plan.LibraryPaths {
			if !slices.Contains(d.libs, p) {
				d.libs = append(d.libs, p)
			}
		}
	}
	if again {
		if len(d.libs) == 0 {
			d.libs = []string{cfg.ContainerPaths.LibraryDir}
		}
		d.pin = pod.Spec.NodeSelector[layout.LabelNRIPlugin] == layout.NRIProtocol
		return d
	}
	switch {
	case len(ready) == 0 && others == 0:
		return runtimeDecision{why: "no ready GPU node fits the pod"}
	case len(ready) == 0:
		return runtimeDecision{why: noPluginWhy}
	case others == 0:
		return d
	case forbidsHostPath || cfg.DriverDelivery == config.DeliveryRuntime:
		d.pin = true
		return d
	}
	return runtimeDecision{why: fmt.Sprintf("%d of the layouts the pod can use have nodes without gpu-injector's NRI plugin", others)}
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
// the plugin, LD_LIBRARY_PATH, and the injection record. No volume, no pin
// on a layout: the node the pod lands on picks its driver.
func (m matcher) injectRuntime(ed *editor, targets []containerRef, d runtimeDecision, legacy []legacyMount, warn func(string, ...any)) {
	pod := ed.pod
	if len(legacy) > 0 {
		replaceLegacy(ed, legacy, d.layout, warn)
	}
	names := make([]string, 0, len(targets))
	for _, ref := range targets {
		names = append(names, ref.get(pod).Name)
		m.mergeLDLibraryPath(ed, ref, d.libs, warn)
	}
	marker := layout.FormatRuntimeMarker(names)
	if have, ok := pod.Annotations[layout.AnnotationRuntimeInject]; ok && have != marker {
		warn("the pod's annotation %s %q was replaced: only gpu-injector writes it", layout.AnnotationRuntimeInject, layout.Truncate(have, 64))
	}
	if pod.Annotations[layout.AnnotationRuntimeInject] != marker {
		ed.do(setAnnotation{key: layout.AnnotationRuntimeInject, value: marker})
	}
	for _, name := range names {
		key, value := requiredPlugins(pod.Annotations, name, warn)
		if pod.Annotations[key] != value {
			ed.do(setAnnotation{key: key, value: value})
		}
	}
	if d.pin {
		if have, ok := pod.Spec.NodeSelector[layout.LabelNRIPlugin]; !ok {
			ed.do(addNodeSelector{key: layout.LabelNRIPlugin, value: layout.NRIProtocol})
			warn("pinned to nodes whose gpu-injector NRI plugin is registered (nodeSelector %s=%s): some GPU nodes this pod could use can only get the driver as hostPath volumes, which are not an option here; an autoscaler adds a node for this pod only if its node template carries that label",
				layout.LabelNRIPlugin, layout.NRIProtocol)
		} else if have != layout.NRIProtocol {
			warn("pod's nodeSelector %s=%s conflicts with the runtime injection's %s=%s; kept the pod's", layout.LabelNRIPlugin, have, layout.LabelNRIPlugin, layout.NRIProtocol)
		}
	}
	record := layout.Injected{Runtime: layout.InjectedByNRI, Containers: names}.String()
	if pod.Annotations[layout.AnnotationInjected] != record {
		ed.do(setAnnotation{key: layout.AnnotationInjected, value: record})
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
