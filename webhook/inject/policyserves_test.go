package inject_test

import (
	"testing"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	. "github.com/gpu-injector/gpu-injector/webhook/inject"
)

// TestPolicyServes: the admission policy may answer in the webhook's stead
// under Runtime always, under PreferRuntime while no known layout needs
// hostPath volumes, and never under HostPath.
func TestPolicyServes(t *testing.T) {
	node := func(name string, l map[string]string) *NodeInfo {
		return &NodeInfo{Name: name, Labels: NewLabels(l), AllocatableGPUs: 8}
	}
	nri := map[string]string{layout.LabelNRIPlugin: layout.NRIProtocol}
	files := layout.Plan{Mounts: []layout.Mount{{HostPath: "/usr/lib64/libcuda.so.1", ContainerPath: "/usr/lib64/libcuda.so.1", Kind: layout.KindFile}}}
	plugin := &Layout{Fingerprint: "a", Plan: files, Nodes: []*NodeInfo{node("gpu-1", nri), node("gpu-2", nri)}}
	mixed := &Layout{Fingerprint: "b", Plan: files, Nodes: []*NodeInfo{node("gpu-3", nri), node("gpu-4", nil)}}
	toolkit := &Layout{Fingerprint: "c", Plan: layout.Plan{RuntimeInjection: layout.RuntimeToolkit}, Nodes: []*NodeInfo{node("eks-1", nil)}}
	// A pool at zero remembered: no node to say whether it runs the plugin.
	remembered := &Layout{Fingerprint: "d", Plan: files}
	wedged := []*WedgedNode{{Node: node("gpu-5", nri), Reason: "Xid 79"}}
	tests := map[string]struct {
		delivery         config.DriverDelivery
		runtimeInjection config.RuntimeInjection
		layouts          []*Layout
		wedged           []*WedgedNode
		want             bool
	}{
		"every pool at zero":                {want: true},
		"the plugin on every node":          {layouts: []*Layout{plugin}, want: true},
		"the plugin's and the toolkit's":    {layouts: []*Layout{plugin, toolkit}, want: true},
		"a node without the plugin":         {layouts: []*Layout{plugin, mixed}},
		"a pool at zero remembered":         {layouts: []*Layout{remembered}},
		"a wedged driver":                   {layouts: []*Layout{plugin}, wedged: wedged},
		"toolkit nodes left alone (Skip)":   {layouts: []*Layout{toolkit}, runtimeInjection: config.RuntimeInjectionSkip},
		"Runtime, whatever the nodes":       {delivery: config.DeliveryRuntime, layouts: []*Layout{mixed}, wedged: wedged, want: true},
		"HostPath, whatever the nodes":      {delivery: config.DeliveryHostPath, layouts: []*Layout{plugin}},
		"HostPath, every pool at zero":      {delivery: config.DeliveryHostPath},
		"Skip with the plugin's nodes only": {layouts: []*Layout{plugin}, runtimeInjection: config.RuntimeInjectionSkip, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := config.Default()
			if tc.delivery != "" {
				cfg.DriverDelivery = tc.delivery
			}
			if tc.runtimeInjection != "" {
				cfg.RuntimeInjection = tc.runtimeInjection
			}
			if got := PolicyServes(cfg, tc.layouts, tc.wedged); got != tc.want {
				t.Errorf("PolicyServes = %v, want %v", got, tc.want)
			}
		})
	}
}
