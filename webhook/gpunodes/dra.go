package gpunodes

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
)

// implicitExtendedResourcePrefix + a DeviceClass name is the extended resource
// that Kubernetes (DRAExtendedResource) maps to every class, whether or not
// the class declares a name of its own.
const implicitExtendedResourcePrefix = resourcev1.ResourceDeviceClassPrefix

// DRA keeps what the mutation needs of the cluster's Dynamic Resource
// Allocation objects: which DeviceClasses are GPUs (and which extended
// resource names they serve), which DeviceClasses each ResourceClaim and
// ResourceClaimTemplate requests, and how many GPUs each node's
// ResourceSlices publish, which it hands to the node Index. Like Nodes, every
// object is stripped before the informer stores it.
type DRA struct {
	cfg    *config.Configuration
	idx    *Index
	log    logr.Logger
	reader client.Reader

	mu      sync.Mutex
	classes map[string]deviceClassInfo
	slices  map[string]*sliceInfo
	// pools maps a driver's pool to its slices and newest generation: only
	// slices of the newest generation count, as the scheduler does.
	pools  map[draPoolKey]*draPool
	byNode map[string]map[string]bool

	claimsMu  sync.RWMutex
	claims    map[types.NamespacedName][]string
	templates map[types.NamespacedName][]string

	resources atomic.Pointer[[]string]
	synced    []func() bool
}

type deviceClassInfo struct {
	gpu      bool
	extended string
}

type draPoolKey struct{ driver, pool string }

type draPool struct {
	generation int64
	slices     map[string]bool
}

type sliceInfo struct {
	pool       draPoolKey
	generation int64
	// gpus per node name.
	gpus map[string]int64
}

// NewDRA returns an empty DRA cache feeding idx. reader, if set, answers for
// a claim or template the cache does not hold yet (one created in the same
// apply as the pod).
func NewDRA(cfg *config.Configuration, idx *Index, reader client.Reader, log logr.Logger) *DRA {
	d := &DRA{
		cfg: cfg, idx: idx, reader: reader, log: log,
		classes:   map[string]deviceClassInfo{},
		slices:    map[string]*sliceInfo{},
		pools:     map[draPoolKey]*draPool{},
		byNode:    map[string]map[string]bool{},
		claims:    map[types.NamespacedName][]string{},
		templates: map[types.NamespacedName][]string{},
	}
	d.publishResources()
	return d
}

// DRAServed reports whether the API server serves resource.k8s.io/v1, which
// Kubernetes 1.34 and later do; older clusters get no DRA informers.
func DRAServed(dc discovery.DiscoveryInterface) (bool, error) {
	list, err := dc.ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("failed to discover %s: %w", resourcev1.SchemeGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Kind == "ResourceSlice" {
			return true, nil
		}
	}
	return false, nil
}

// DRACacheByObject lists the stripped DRA kinds for the manager's cache. Only
// where DRAServed: the cache maps every entry to its API when it is made, and
// a kind the API server does not serve fails the manager's start.
func DRACacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&resourcev1.ResourceSlice{}:         {Transform: stripSlice},
		&resourcev1.DeviceClass{}:           {Transform: stripClass},
		&resourcev1.ResourceClaim{}:         {Transform: stripClaim},
		&resourcev1.ResourceClaimTemplate{}: {Transform: stripTemplate},
	}
}

// Watch feeds the cache from the manager's informers.
func (d *DRA) Watch(ctx context.Context, c cache.Cache) error {
	for _, w := range []struct {
		obj    client.Object
		set    func(any)
		delete func(any)
	}{
		{&resourcev1.ResourceSlice{}, d.setSlice, d.deleteSlice},
		{&resourcev1.DeviceClass{}, d.setClass, d.deleteClass},
		{&resourcev1.ResourceClaim{}, d.setClaim, d.deleteClaim},
		{&resourcev1.ResourceClaimTemplate{}, d.setTemplate, d.deleteTemplate},
	} {
		inf, err := c.GetInformer(ctx, w.obj)
		if err != nil {
			return fmt.Errorf("failed to get the %T informer: %w", w.obj, err)
		}
		del := w.delete
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    w.set,
			UpdateFunc: func(_, o any) { w.set(o) },
			DeleteFunc: func(o any) {
				if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = t.Obj
				}
				del(o)
			},
		})
		if err != nil {
			return fmt.Errorf("failed to add the %T event handler: %w", w.obj, err)
		}
		d.synced = append(d.synced, reg.HasSynced)
	}
	return nil
}

// Add records a DRA object as its informer would (stripped first); other
// objects are ignored. It feeds the offline command and tests.
func (d *DRA) Add(obj any) {
	switch o := obj.(type) {
	case *resourcev1.ResourceSlice:
		s, _ := stripSlice(o.DeepCopy())
		d.setSlice(s)
	case *resourcev1.DeviceClass:
		c, _ := stripClass(o.DeepCopy())
		d.setClass(c)
	case *resourcev1.ResourceClaim:
		c, _ := stripClaim(o.DeepCopy())
		d.setClaim(c)
	case *resourcev1.ResourceClaimTemplate:
		c, _ := stripTemplate(o.DeepCopy())
		d.setTemplate(c)
	}
}

// IsDRAKind reports whether Add takes objects of this kind.
func IsDRAKind(kind string) bool {
	switch kind {
	case "ResourceSlice", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate":
		return true
	}
	return false
}

// NewDRAObject returns an empty object of a kind IsDRAKind accepts.
func NewDRAObject(kind string) client.Object {
	switch kind {
	case "ResourceSlice":
		return &resourcev1.ResourceSlice{}
	case "DeviceClass":
		return &resourcev1.DeviceClass{}
	case "ResourceClaim":
		return &resourcev1.ResourceClaim{}
	case "ResourceClaimTemplate":
		return &resourcev1.ResourceClaimTemplate{}
	}
	return nil
}

// ReadyCheck is a healthz checker for /readyz.
func (d *DRA) ReadyCheck(_ *http.Request) error {
	for _, s := range d.synced {
		if !s() {
			return fmt.Errorf("DRA cache has not synced yet")
		}
	}
	return nil
}

// GPUResources are extended resource names that GPU DeviceClasses serve: the
// names they declare, and the implicit deviceclass.resource.kubernetes.io/
// name of each. The slice is shared and must not be changed.
func (d *DRA) GPUResources() []string { return *d.resources.Load() }

// GPUClaims returns the names of the pod's resourceClaims entries that
// request a GPU DeviceClass, and warnings for claims it could not read.
func (d *DRA) GPUClaims(ctx context.Context, pod *corev1.Pod, namespace string) ([]string, []string) {
	var gpu, warnings []string
	for _, pc := range pod.Spec.ResourceClaims {
		var key types.NamespacedName
		var classes []string
		var ok bool
		switch {
		case pc.ResourceClaimTemplateName != nil:
			key = types.NamespacedName{Namespace: namespace, Name: *pc.ResourceClaimTemplateName}
			d.claimsMu.RLock()
			classes, ok = d.templates[key]
			d.claimsMu.RUnlock()
			if !ok && d.reader != nil {
				t := &resourcev1.ResourceClaimTemplate{}
				if err := d.reader.Get(ctx, key, t); err == nil {
					classes, ok = templateClasses(t), true
				} else if !apierrors.IsNotFound(err) {
					warnings = append(warnings, fmt.Sprintf("failed to read ResourceClaimTemplate %s: %v", key.Name, err))
				}
			}
		case pc.ResourceClaimName != nil:
			key = types.NamespacedName{Namespace: namespace, Name: *pc.ResourceClaimName}
			d.claimsMu.RLock()
			classes, ok = d.claims[key]
			d.claimsMu.RUnlock()
			if !ok && d.reader != nil {
				c := &resourcev1.ResourceClaim{}
				if err := d.reader.Get(ctx, key, c); err == nil {
					classes, ok = claimClasses(&c.Spec), true
				} else if !apierrors.IsNotFound(err) {
					warnings = append(warnings, fmt.Sprintf("failed to read ResourceClaim %s: %v", key.Name, err))
				}
			}
		}
		if !ok {
			continue
		}
		for _, c := range classes {
			if d.isGPUClass(c) {
				gpu = append(gpu, pc.Name)
				break
			}
		}
	}
	return gpu, warnings
}

func (d *DRA) isGPUClass(name string) bool {
	d.mu.Lock()
	ci, known := d.classes[name]
	d.mu.Unlock()
	if known {
		return ci.gpu
	}
	return d.cfg.IsGPUClassName(name)
}

// driverSelector finds device.driver == "X" in a CEL selector: how NVIDIA's
// classes and the ones users write for a MIG profile name their driver.
var driverSelector = regexp.MustCompile(`device\.driver\s*==\s*["']([^"']+)["']`)

// ClassIsGPU says whether a DeviceClass is a GPU class: its name is
// configured, or its selector requires a configured driver.
func ClassIsGPU(cfg *config.Configuration, dc *resourcev1.DeviceClass) bool {
	if cfg.IsGPUClassName(dc.Name) {
		return true
	}
	for _, s := range dc.Spec.Selectors {
		if s.CEL == nil {
			continue
		}
		for _, m := range driverSelector.FindAllStringSubmatch(s.CEL.Expression, -1) {
			if slices.Contains(cfg.DRA.Drivers, m[1]) {
				return true
			}
		}
	}
	return false
}

func (d *DRA) setClass(o any) {
	dc, ok := o.(*resourcev1.DeviceClass)
	if !ok {
		return
	}
	ci := deviceClassInfo{gpu: ClassIsGPU(d.cfg, dc)}
	if dc.Spec.ExtendedResourceName != nil {
		ci.extended = *dc.Spec.ExtendedResourceName
	}
	d.mu.Lock()
	d.classes[dc.Name] = ci
	d.mu.Unlock()
	d.publishResources()
}

func (d *DRA) deleteClass(o any) {
	dc, ok := o.(*resourcev1.DeviceClass)
	if !ok {
		return
	}
	d.mu.Lock()
	delete(d.classes, dc.Name)
	d.mu.Unlock()
	d.publishResources()
}

func (d *DRA) publishResources() {
	set := map[string]bool{}
	for _, c := range d.cfg.DRA.DeviceClasses {
		if !hasMeta(c) {
			set[implicitExtendedResourcePrefix+c] = true
		}
	}
	d.mu.Lock()
	for name, ci := range d.classes {
		if !ci.gpu {
			continue
		}
		set[implicitExtendedResourcePrefix+name] = true
		if ci.extended != "" {
			set[ci.extended] = true
		}
	}
	d.mu.Unlock()
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	d.resources.Store(&out)
}

func hasMeta(p string) bool {
	for _, r := range p {
		if r == '*' || r == '?' || r == '[' {
			return true
		}
	}
	return false
}

func (d *DRA) setClaim(o any) {
	if c, ok := o.(*resourcev1.ResourceClaim); ok {
		d.claimsMu.Lock()
		d.claims[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = claimClasses(&c.Spec)
		d.claimsMu.Unlock()
	}
}

func (d *DRA) deleteClaim(o any) {
	if c, ok := o.(*resourcev1.ResourceClaim); ok {
		d.claimsMu.Lock()
		delete(d.claims, types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
		d.claimsMu.Unlock()
	}
}

func (d *DRA) setTemplate(o any) {
	if t, ok := o.(*resourcev1.ResourceClaimTemplate); ok {
		d.claimsMu.Lock()
		d.templates[types.NamespacedName{Namespace: t.Namespace, Name: t.Name}] = templateClasses(t)
		d.claimsMu.Unlock()
	}
}

func (d *DRA) deleteTemplate(o any) {
	if t, ok := o.(*resourcev1.ResourceClaimTemplate); ok {
		d.claimsMu.Lock()
		delete(d.templates, types.NamespacedName{Namespace: t.Namespace, Name: t.Name})
		d.claimsMu.Unlock()
	}
}

func templateClasses(t *resourcev1.ResourceClaimTemplate) []string {
	return claimClasses(&t.Spec.Spec)
}

// claimClasses lists the DeviceClasses a claim's requests name, in either
// form: exactly one class, or a list of alternatives.
func claimClasses(spec *resourcev1.ResourceClaimSpec) []string {
	var out []string
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName != "" {
			out = append(out, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			if s.DeviceClassName != "" {
				out = append(out, s.DeviceClassName)
			}
		}
	}
	return out
}

// setSlice records a ResourceSlice and recounts the GPUs of the nodes it
// touches. Only drivers configured as GPU drivers count.
func (d *DRA) setSlice(o any) {
	s, ok := o.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	touched := d.removeSliceLocked(s.Name)
	if !slices.Contains(d.cfg.DRA.Drivers, s.Spec.Driver) {
		d.recountLocked(touched)
		return
	}
	si := &sliceInfo{pool: draPoolKey{s.Spec.Driver, s.Spec.Pool.Name}, generation: s.Spec.Pool.Generation, gpus: sliceGPUs(s)}
	d.slices[s.Name] = si
	ps := d.pools[si.pool]
	if ps == nil {
		ps = &draPool{slices: map[string]bool{}}
		d.pools[si.pool] = ps
	}
	ps.slices[s.Name] = true
	if si.generation > ps.generation {
		// A newer generation makes the pool's older slices stale: their
		// nodes count again without them.
		ps.generation = si.generation
		for name := range ps.slices {
			for n := range d.slices[name].gpus {
				touched[n] = true
			}
		}
	}
	for n := range si.gpus {
		touched[n] = true
		if d.byNode[n] == nil {
			d.byNode[n] = map[string]bool{}
		}
		d.byNode[n][s.Name] = true
	}
	d.recountLocked(touched)
}

func (d *DRA) deleteSlice(o any) {
	s, ok := o.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recountLocked(d.removeSliceLocked(s.Name))
}

// removeSliceLocked forgets a slice and returns the nodes whose count may
// change, including those of its pool if the pool's generation drops.
func (d *DRA) removeSliceLocked(name string) map[string]bool {
	touched := map[string]bool{}
	si, ok := d.slices[name]
	if !ok {
		return touched
	}
	delete(d.slices, name)
	for n := range si.gpus {
		touched[n] = true
		delete(d.byNode[n], name)
		if len(d.byNode[n]) == 0 {
			delete(d.byNode, n)
		}
	}
	ps := d.pools[si.pool]
	delete(ps.slices, name)
	if len(ps.slices) == 0 {
		delete(d.pools, si.pool)
		return touched
	}
	var newest int64
	for other := range ps.slices {
		newest = max(newest, d.slices[other].generation)
	}
	if newest != ps.generation {
		ps.generation = newest
		for other := range ps.slices {
			for n := range d.slices[other].gpus {
				touched[n] = true
			}
		}
	}
	return touched
}

func (d *DRA) recountLocked(nodes map[string]bool) {
	for n := range nodes {
		var gpus int64
		for name := range d.byNode[n] {
			si := d.slices[name]
			if si.generation == d.pools[si.pool].generation {
				gpus += si.gpus[n]
			}
		}
		d.idx.SetDRAGPUs(n, gpus)
	}
}

// sliceGPUs counts a slice's GPUs per node. NVIDIA's driver types each
// device (attribute "type": gpu, mig, ...); a node that publishes whole GPUs
// and the MIG partitions they could have counts the GPUs only. A slice of
// MIG devices alone counts those, as nvidia.com/mig-* resources do.
func sliceGPUs(s *resourcev1.ResourceSlice) map[string]int64 {
	whole, all := map[string]int64{}, map[string]int64{}
	for i := range s.Spec.Devices {
		dev := &s.Spec.Devices[i]
		node := ""
		switch {
		case s.Spec.NodeName != nil:
			node = *s.Spec.NodeName
		case dev.NodeName != nil:
			node = *dev.NodeName
		}
		if node == "" {
			// Network-attached devices (allNodes, node selectors) belong to
			// no node of their own.
			continue
		}
		all[node]++
		if t := deviceType(s.Spec.Driver, dev); t == "" || t == "gpu" {
			whole[node]++
		}
	}
	for n, c := range all {
		if whole[n] == 0 {
			whole[n] = c
		}
	}
	return whole
}

func deviceType(driver string, dev *resourcev1.Device) string {
	for _, k := range []resourcev1.QualifiedName{"type", resourcev1.QualifiedName(driver + "/type")} {
		if a, ok := dev.Attributes[k]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}

// stripSlice keeps a ResourceSlice's driver, pool, node and, of each device,
// its name, node and type: enough to count GPUs per node.
func stripSlice(obj any) (any, error) {
	s, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return obj, nil
	}
	out := &resourcev1.ResourceSlice{}
	out.Name, out.ResourceVersion = s.Name, s.ResourceVersion
	out.Spec.Driver, out.Spec.Pool, out.Spec.NodeName = s.Spec.Driver, s.Spec.Pool, s.Spec.NodeName
	out.Spec.Devices = make([]resourcev1.Device, len(s.Spec.Devices))
	for i := range s.Spec.Devices {
		dev := &s.Spec.Devices[i]
		out.Spec.Devices[i] = resourcev1.Device{Name: dev.Name, NodeName: dev.NodeName}
		if t := deviceType(s.Spec.Driver, dev); t != "" {
			out.Spec.Devices[i].Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": {StringValue: &t}}
		}
	}
	return out, nil
}

func stripClass(obj any) (any, error) {
	c, ok := obj.(*resourcev1.DeviceClass)
	if !ok {
		return obj, nil
	}
	out := &resourcev1.DeviceClass{}
	out.Name, out.ResourceVersion = c.Name, c.ResourceVersion
	out.Spec.Selectors, out.Spec.ExtendedResourceName = c.Spec.Selectors, c.Spec.ExtendedResourceName
	return out, nil
}

// stripRequests keeps only the DeviceClass names of a claim's requests.
func stripRequests(spec resourcev1.ResourceClaimSpec) resourcev1.ResourceClaimSpec {
	var out resourcev1.ResourceClaimSpec
	for _, c := range claimClasses(&spec) {
		out.Devices.Requests = append(out.Devices.Requests, resourcev1.DeviceRequest{Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: c}})
	}
	return out
}

func stripClaim(obj any) (any, error) {
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok {
		return obj, nil
	}
	out := &resourcev1.ResourceClaim{Spec: stripRequests(c.Spec)}
	out.Name, out.Namespace, out.ResourceVersion = c.Name, c.Namespace, c.ResourceVersion
	return out, nil
}

func stripTemplate(obj any) (any, error) {
	t, ok := obj.(*resourcev1.ResourceClaimTemplate)
	if !ok {
		return obj, nil
	}
	out := &resourcev1.ResourceClaimTemplate{}
	out.Name, out.Namespace, out.ResourceVersion = t.Name, t.Namespace, t.ResourceVersion
	out.Spec.Spec = stripRequests(t.Spec.Spec)
	return out, nil
}
