package gpunodes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

func readyGPUNode(name, fp, annotation string, allocatable int64) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{layout.LabelState: layout.StateReady, layout.LabelFingerprint: fp},
		Annotations: map[string]string{layout.AnnotationLayout: annotation},
	}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if allocatable > 0 {
		n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(allocatable, resource.DecimalSI)}
	}
	return n
}

// slice is a ResourceSlice of NVIDIA's DRA driver: one pool per node, each
// device typed as the driver types it.
func slice(name, node string, generation int64, types ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}}
	s.Spec.Driver = "gpu.nvidia.com"
	s.Spec.Pool = resourcev1.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: 1}
	s.Spec.NodeName = &node
	for i, t := range types {
		t := t
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
			Name:       fmt.Sprintf("%s-%d", t, i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": {StringValue: &t}, "productName": {StringValue: ptr.To("NVIDIA A100")}},
		})
	}
	return s
}

func strip(t *testing.T, f func(any) (any, error), o any) any {
	t.Helper()
	out, err := f(o)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDRACountsSliceGPUs(t *testing.T) {
	cfg := config.Default()
	idx := NewIndex(cfg, logr.Discard())
	d := NewDRA(cfg, idx, nil, logr.Discard())
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "580.95.05", Mounts: []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}}}
	ann, _ := layout.Encode(plan)
	fp := plan.Fingerprint()
	gpus := func() int64 {
		t.Helper()
		ls := idx.Layouts()
		if len(ls) != 1 {
			t.Fatalf("want 1 layout, got %d", len(ls))
		}
		return ls[0].AllocatableGPUs
	}

	// A DRA node lists no nvidia.com/gpu: its GPUs are in ResourceSlices.
	idx.Update(readyGPUNode("dra-1", fp, ann, 0))
	if g := gpus(); g != 0 {
		t.Fatalf("before any slice: %d GPUs, want 0", g)
	}
	d.setSlice(strip(t, stripSlice, slice("dra-1-gpu", "dra-1", 1, "gpu", "gpu", "mig", "mig", "mig")))
	if g := gpus(); g != 2 {
		t.Errorf("whole GPUs and their MIG partitions: %d GPUs, want 2 (the whole GPUs)", g)
	}
	// A newer generation of the pool replaces the old slice's devices.
	d.setSlice(strip(t, stripSlice, slice("dra-1-gpu-v2", "dra-1", 2, "gpu", "gpu", "gpu", "gpu")))
	if g := gpus(); g != 4 {
		t.Errorf("after a new pool generation: %d GPUs, want 4 (the old generation's slice is stale)", g)
	}
	d.deleteSlice(slice("dra-1-gpu-v2", "dra-1", 2))
	if g := gpus(); g != 2 {
		t.Errorf("newest generation deleted: %d GPUs, want the remaining slice's 2", g)
	}
	// A node that comes after its slices gets them too, added to allocatable.
	plan2 := plan
	plan2.DriverVersion = "570.1"
	ann2, _ := layout.Encode(plan2)
	d.setSlice(strip(t, stripSlice, slice("dra-2-mig", "dra-2", 1, "mig", "mig", "mig")))
	idx.Update(readyGPUNode("dra-2", plan2.Fingerprint(), ann2, 1))
	for _, l := range idx.Layouts() {
		if l.Fingerprint == plan2.Fingerprint() && l.AllocatableGPUs != 4 {
			t.Errorf("node with 1 allocatable and 3 MIG devices in slices: %d GPUs, want 4", l.AllocatableGPUs)
		}
	}
	// Another driver's devices are not GPUs.
	other := slice("nic", "dra-1", 1, "nic", "nic")
	other.Spec.Driver = "dra.net"
	d.setSlice(strip(t, stripSlice, other))
	for _, l := range idx.Layouts() {
		if l.Fingerprint == fp && l.AllocatableGPUs != 2 {
			t.Errorf("a network driver's slice changed the count to %d", l.AllocatableGPUs)
		}
	}
	// A node's own count is bounded, whatever its slices say.
	many := make([]string, 1000)
	for i := range many {
		many[i] = "gpu"
	}
	d.setSlice(strip(t, stripSlice, slice("huge", "dra-3", 1, many...)))
	idx.Update(readyGPUNode("dra-3", fp, ann, 0))
	for _, l := range idx.Layouts() {
		if l.Fingerprint == fp && l.AllocatableGPUs != 2+MaxNodeGPUs {
			t.Errorf("1000 devices: layout counts %d, want 2+%d", l.AllocatableGPUs, MaxNodeGPUs)
		}
	}
}

func TestStripSliceKeepsOnlyCounts(t *testing.T) {
	s := slice("s", "n", 1, "gpu")
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	s.Spec.Devices[0].Capacity = map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {}}
	out := strip(t, stripSlice, s).(*resourcev1.ResourceSlice)
	dev := out.Spec.Devices[0]
	if out.ManagedFields != nil || dev.Capacity != nil || len(dev.Attributes) != 1 || *dev.Attributes["type"].StringValue != "gpu" {
		t.Errorf("stripped slice keeps more than it needs: %+v", out)
	}
}

func TestDRAGPUClaims(t *testing.T) {
	cfg := config.Default()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	// Only the API server knows this one: created in the same apply as the pod.
	late := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "ml"}}
	late.Spec.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(late).Build()
	d := NewDRA(cfg, NewIndex(cfg, logr.Discard()), reader, logr.Discard())

	// A class users write for one MIG profile, as NVIDIA's examples do.
	mig := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "mig-1g-12gb"}}
	mig.Spec.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'`}}}
	mig.Spec.ExtendedResourceName = ptr.To("example.com/mig-1g")
	nic := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "rdma"}}
	nic.Spec.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "dra.net"`}}}
	nic.Spec.ExtendedResourceName = ptr.To("example.com/rdma")
	d.setClass(strip(t, stripClass, mig))
	d.setClass(strip(t, stripClass, nic))

	tmpl := func(name, class string) *resourcev1.ResourceClaimTemplate {
		rt := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}}
		rt.Spec.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "r", FirstAvailable: []resourcev1.DeviceSubRequest{{Name: "a", DeviceClassName: class}}}}
		return rt
	}
	d.setTemplate(strip(t, stripTemplate, tmpl("one-mig", "mig-1g-12gb")))
	d.setTemplate(strip(t, stripTemplate, tmpl("one-nic", "rdma")))
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared-gpu", Namespace: "ml"}}
	claim.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}
	d.setClaim(strip(t, stripClaim, claim))

	pod := &corev1.Pod{}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{
		{Name: "mig", ResourceClaimTemplateName: ptr.To("one-mig")},
		{Name: "nic", ResourceClaimTemplateName: ptr.To("one-nic")},
		{Name: "shared", ResourceClaimName: ptr.To("shared-gpu")},
		{Name: "late", ResourceClaimTemplateName: ptr.To("late")},
		{Name: "missing", ResourceClaimName: ptr.To("nope")},
	}
	got, warnings := d.GPUClaims(context.Background(), pod, "ml")
	if want := []string{"mig", "shared", "late"}; !slices.Equal(got, want) || len(warnings) > 0 {
		t.Errorf("GPU claims %v (warnings %v), want %v", got, warnings, want)
	}
	res := d.GPUResources()
	for _, want := range []string{"example.com/mig-1g", "deviceclass.resource.kubernetes.io/mig-1g-12gb", "deviceclass.resource.kubernetes.io/gpu.nvidia.com"} {
		if !slices.Contains(res, want) {
			t.Errorf("GPU resources %v lack %s", res, want)
		}
	}
	if slices.Contains(res, "example.com/rdma") {
		t.Errorf("a network class's resource counts as a GPU: %v", res)
	}
	d.deleteClass(mig)
	if slices.Contains(d.GPUResources(), "example.com/mig-1g") {
		t.Errorf("a deleted class's resource still counts")
	}
}

// TestDRAServed: resource.k8s.io/v1 is asked of discovery before the manager
// is made, whose cache cannot start with a kind the API server lacks (1.33).
func TestDRAServed(t *testing.T) {
	tests := map[string]struct {
		resources []*metav1.APIResourceList
		want      bool
	}{
		"1.34 and later":  {resources: []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "resourceslices", Kind: "ResourceSlice"}}}}, want: true},
		"1.33: beta only": {resources: []*metav1.APIResourceList{{GroupVersion: "resource.k8s.io/v1beta2", APIResources: []metav1.APIResource{{Name: "resourceslices", Kind: "ResourceSlice"}}}}},
		"no DRA at all":   {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tc.resources}}
			got, err := DRAServed(dc)
			if err != nil || got != tc.want {
				t.Errorf("DRAServed = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	t.Run("a discovery error is not taken for no DRA", func(t *testing.T) {
		fake := &clienttesting.Fake{}
		fake.AddReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("connection refused")
		})
		if _, err := DRAServed(&fakediscovery.FakeDiscovery{Fake: fake}); err == nil {
			t.Error("DRAServed hid a discovery error")
		}
	})
}
