// Package podstatus is `gpu-injector status pod NAMESPACE/NAME`: what
// gpu-injector did to one pod and what stands in its way now. It reads the
// pod's injection record, the node it runs on and that node's probe and NRI
// plugin, and, for a pod that is Pending, refused or not created, decides
// the pod again with the webhook's own builder of its input
// (webhook/admitinput) and mutation (webhook/inject), as `gpu-injector
// mutate` does, so the reason it prints is the one the webhook would give
// now. With -f it reads all of this from files, and no API server.
package podstatus

import "github.com/gpu-injector/gpu-injector/layout"

// Deliveries: how the pod's GPU containers get the driver.
const (
	// DeliveryHostPath: hostPath volumes the webhook added, pinned to a layout.
	DeliveryHostPath = "hostPath"
	// DeliveryNRI: the NRI plugin of the node adds the driver at container
	// creation.
	DeliveryNRI = "nri-plugin"
	// DeliveryNodeRuntime: the node's own runtime or device plugin injects;
	// the webhook pinned the pod to the layout without mounts.
	DeliveryNodeRuntime = "node-runtime"
	// DeliveryNone: the pod carries no injection record.
	DeliveryNone = "none"
)

// Report is what `status pod` found; its JSON and YAML forms are -o json and
// -o yaml.
type Report struct {
	Pod   string `json:"pod"`
	Phase string `json:"phase"`
	Node  string `json:"node,omitempty"`
	// Record is the pod's gpu-injector.io/injected annotation; RecordNote
	// says why there is none or why it was not read.
	Record     *layout.Injected `json:"record,omitempty"`
	RecordNote string           `json:"recordNote,omitempty"`
	// ImagesUnread are the images the webhook admitted the pod without
	// reading, with the registry's answer, as the pod's
	// gpu-injector.io/images-unread annotation says; ImagesUnreadNote says
	// why a record there was not believed.
	ImagesUnread     []layout.ImageUnread `json:"imagesUnread,omitempty"`
	ImagesUnreadNote string               `json:"imagesUnreadNote,omitempty"`
	// RuntimeMarker lists the containers marked for the NRI plugin.
	RuntimeMarker []string `json:"runtimeMarker,omitempty"`
	Delivery      string   `json:"delivery"`
	// HostPaths are the driver's host folders and files the pod mounts.
	HostPaths []string `json:"hostPaths,omitempty"`
	// NodeLayout is the pod's node as its probe publishes it now.
	NodeLayout *NodeLayout `json:"nodeLayout,omitempty"`
	// Scheduling is the scheduler's word on a pod it has not placed.
	Scheduling string `json:"scheduling,omitempty"`
	// Containers are the GPU containers and any container waiting on an
	// error.
	Containers []Container `json:"containers,omitempty"`
	// Admission is the webhook's decision on the pod now, for a pod that is
	// Pending or refused.
	Admission *Admission `json:"admission,omitempty"`
	// StaleDriver says whether the pod runs a driver deleted since it
	// started: yes, no or unknown, with why.
	StaleDriver string `json:"staleDriver"`
	// Attention lists what needs someone; the exit status is 3 when it is
	// not empty.
	Attention []string `json:"attention"`
}

// NodeLayout is the pod's node now.
type NodeLayout struct {
	Name          string `json:"name"`
	State         string `json:"state,omitempty"`
	Reason        string `json:"reason,omitempty"`
	Fingerprint   string `json:"fingerprint,omitempty"`
	DriverVersion string `json:"driverVersion,omitempty"`
	// NRIPlugin is the node's gpu-injector.io/nri-plugin label: the plugin
	// is registered with the node's runtime.
	NRIPlugin string `json:"nriPlugin,omitempty"`
	// Runtime is the layout's runtimeInjection: the node injects by itself.
	Runtime string `json:"runtime,omitempty"`
	// Plugin says the NRI plugin's state on the node in words.
	Plugin string `json:"plugin"`
	// StillHas says whether the node still has the layout and driver the
	// pod got; the note says how it differs.
	StillHas bool   `json:"stillHas"`
	Note     string `json:"note,omitempty"`
}

// Container is one container's state where it matters to the driver.
type Container struct {
	Name    string `json:"name"`
	GPU     bool   `json:"gpu"`
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// RefusedByPlugin: the runtime did not create it, on gpu-injector's NRI
	// plugin's word.
	RefusedByPlugin bool `json:"refusedByPlugin,omitempty"`
}

// Admission is the webhook's decision now.
type Admission struct {
	Decision      string   `json:"decision"`
	Reason        string   `json:"reason,omitempty"`
	Fingerprint   string   `json:"fingerprint,omitempty"`
	DriverVersion string   `json:"driverVersion,omitempty"`
	Runtime       bool     `json:"runtime,omitempty"`
	Warnings      []string `json:"warnings,omitempty"`
	// Note says what the decision could not take into account.
	Note string `json:"note,omitempty"`
}
