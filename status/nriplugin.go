package status

import (
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// PluginStatus is what the report says of gpu-injector's NRI plugin: the
// ready GPU nodes whose runtime has no plugin registered, once runtime
// injection is in use (some node has the plugin, or driverDelivery is
// Runtime). Admission reads no node for a pod the plugin serves, so such a
// pod may land on one of them.
type PluginStatus struct {
	// DriverDelivery is the configuration's driverDelivery.
	DriverDelivery config.DriverDelivery `json:"driverDelivery"`
	// Without are the ready GPU nodes with no registered plugin (no label
	// gpu-injector.io/nri-plugin), sorted; nodes whose own runtime or
	// device plugin injects the driver are not among them.
	Without []string `json:"without,omitempty"`
}

// readPlugin lists the ready GPU nodes without a registered plugin, once
// runtime injection is in use; r.Nodes must be read first.
func readPlugin(cfg *config.Configuration, r *Report) {
	r.Plugin.DriverDelivery = cfg.DriverDelivery
	if cfg.DriverDelivery == config.DeliveryHostPath {
		return
	}
	inUse := cfg.DriverDelivery == config.DeliveryRuntime
	var without []string
	for _, n := range r.Nodes {
		switch {
		case n.NRIPlugin != "":
			inUse = true
		case n.State == layout.StateReady && n.Runtime == "":
			without = append(without, n.Name)
		}
	}
	if inUse {
		r.Plugin.Without = without
	}
}

// pluginAttention names the nodes without the plugin when every GPU pod is
// marked for it (driverDelivery: Runtime): a pod that lands there is refused
// by the runtime's NRI validator, or runs without its driver where the
// runtime has none. Under PreferRuntime they are named but need no action:
// a pod that can only land there gets hostPath volumes.
func (r *Report) pluginAttention() {
	if r.Plugin.DriverDelivery == config.DeliveryRuntime && len(r.Plugin.Without) > 0 {
		r.attention("GPU nodes without a registered gpu-injector NRI plugin under driverDelivery: %s: %s; the GPU pods that land there are refused by the runtime's NRI validator, or run without their driver where the runtime has none",
			config.DeliveryRuntime, strings.Join(r.Plugin.Without, ", "))
	}
}

// pluginLine is the report's line under GPU NODES, "" when there is
// nothing to say.
func pluginLine(p PluginStatus) (string, tone) {
	if len(p.Without) == 0 {
		return "", plain
	}
	names := strings.Join(p.Without, ", ")
	if p.DriverDelivery == config.DeliveryRuntime {
		return "without a registered NRI plugin (driverDelivery: " + string(config.DeliveryRuntime) + ", so their GPU pods fail to start): " + names, bad
	}
	return "without a registered NRI plugin (hostPath volumes for the pods that can only land there; see " + layout.LabelNRIPlugin + "): " + names, warn
}
