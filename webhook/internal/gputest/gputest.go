// Package gputest builds the GPU nodes, plans and pods the webhook's tests
// share, and checks what every mutation must keep. It imports the injection
// only, so that the node index's own tests can use it.
package gputest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// Plan is a valid driver-folder layout of the given driver version.
func Plan(version string) layout.Plan {
	return layout.Plan{
		SchemaVersion: layout.SchemaVersion, DriverVersion: version, LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{
			{HostPath: "/usr/lib/nvidia-" + version, ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
			{HostPath: "/usr/lib/nvidia-" + version + "/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
		},
	}
}

// Node is a ready, schedulable GPU node publishing p, as the probe would.
func Node(name string, p layout.Plan, gpus int64, mod func(*corev1.Node)) *corev1.Node {
	enc, err := layout.Encode(p)
	if err != nil {
		panic(err)
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{"kubernetes.io/hostname": name, layout.LabelState: layout.StateReady, layout.LabelFingerprint: p.Fingerprint()},
			Annotations: map[string]string{layout.AnnotationLayout: enc},
		},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI), corev1.ResourceCPU: resource.MustParse("16")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	if mod != nil {
		mod(n)
	}
	return n
}

// MetricValue is the value of a counter or gauge (the first of a vector).
func MetricValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	close(ch)
	m, ok := <-ch
	if !ok {
		return 0
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatalf("metric %v is neither counter nor gauge", m.Desc())
	return 0
}

// HasLabelValue reports whether any of c's series has a label of value.
func HasLabelValue(t testing.TB, c prometheus.Collector, value string) bool {
	t.Helper()
	ch := make(chan prometheus.Metric, 100)
	go func() { c.Collect(ch); close(ch) }()
	found := false
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		for _, l := range d.Label {
			if l.GetValue() == value {
				found = true
			}
		}
	}
	return found
}

// WedgedNode is a ready node its probe marked wedged, as the probe
// publishes it: no layout, the state and the reason.
func WedgedNode(name, reason string, mod func(*corev1.Node)) *corev1.Node {
	return Node(name, Plan("535.104.05"), 8, func(n *corev1.Node) {
		delete(n.Labels, layout.LabelFingerprint)
		delete(n.Annotations, layout.AnnotationLayout)
		n.Labels[layout.LabelState] = layout.StateWedged
		n.Annotations[layout.AnnotationStateReason] = reason
		if mod != nil {
			mod(n)
		}
	})
}

// Pod is a pod of one container; gpuResource "" gives a CPU-only pod.
func Pod(gpuResource string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "cuda-vector-add-"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyOnFailure,
			Containers:    []corev1.Container{{Name: "cuda", Image: "k8s.gcr.io/cuda-vector-add:v0.1"}},
		},
	}
	if gpuResource != "" {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(gpuResource): resource.MustParse("1")}
	}
	if mod != nil {
		mod(p)
	}
	return p
}

// CheckMutation runs Mutate on pod and checks the properties every mutation
// keeps, then runs it again on the result.
func CheckMutation(t *testing.T, pod *corev1.Pod, nsLabels map[string]string, layouts []*inject.Layout, cfg *config.Configuration) {
	t.Helper()
	before := pod.DeepCopy()
	in := inject.Input{Pod: pod, NamespaceLabels: nsLabels, Layouts: layouts, Seed: inject.Seed(pod.Namespace + "/" + pod.Name)}
	res := inject.Mutate(in, cfg)
	CheckUnchangedUnlessInjected(t, before, pod, res)
	if res.Decision != inject.DecisionInjected {
		return
	}

	// The patch the webhook sends makes the same pod out of the one it got.
	CheckPatch(t, before, pod, res.Patch)

	// The pod's own volumes stay as they were; only a hand-written driver
	// mount (a hostPath) may go, replaced by the injected layout, and then
	// nothing mounts it any more. A volume an earlier injection's record
	// lists is not the pod's own: a re-injection may replace it.
	// A name may be given twice (the API server refuses that pod only after
	// admission): the k-th volume of a name is compared with the k-th.
	earlier, _ := inject.PreviousInjection(before)
	had := map[string]bool{}
	nth := map[string]int{}
	for _, v := range before.Spec.Volumes {
		had[v.Name] = true
		if earlier != nil && v.HostPath != nil && slices.Contains(earlier.Volumes, v.Name) {
			had[v.Name] = false
			continue
		}
		i, k := -1, nth[v.Name]
		nth[v.Name]++
		for j, w := range pod.Spec.Volumes {
			if w.Name != v.Name {
				continue
			}
			if k == 0 {
				i = j
				break
			}
			k--
		}
		if i >= 0 {
			if !apiequality.Semantic.DeepEqual(v, pod.Spec.Volumes[i]) {
				t.Fatalf("the pod's volume %q was changed", v.Name)
			}
			continue
		}
		if v.HostPath == nil {
			t.Fatalf("the pod's volume %q, no hostPath, was removed", v.Name)
		}
		for _, c := range inject.AllContainers(pod) {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name {
					t.Fatalf("container %q still mounts the removed volume %q", c.Name, v.Name)
				}
			}
		}
	}
	// What was added is a read-only hostPath of the chosen layout.
	added := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if had[v.Name] {
			continue
		}
		added[v.Name] = true
		if v.HostPath == nil {
			t.Fatalf("added volume %q is not a hostPath", v.Name)
		}
		if res.Layout == nil || !slices.ContainsFunc(res.Layout.Plan.Mounts, func(m layout.Mount) bool { return m.HostPath == v.HostPath.Path }) {
			t.Fatalf("added volume %q (%s) is no mount of the chosen layout", v.Name, v.HostPath.Path)
		}
		kind := layout.KindFile
		if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectory {
			kind = layout.KindDirectory
		}
		if !allowed(v.HostPath.Path, kind, cfg) {
			t.Fatalf("added volume %q mounts %s, outside the allowlist", v.Name, v.HostPath.Path)
		}
	}
	if res.Layout != nil && res.Layout.Static == "" && !res.Layout.Runtime {
		CheckPlanSafe(t, res.Layout.Plan, cfg)
	}
	checkRuntimeMarker(t, pod, res)
	ours := map[string]bool{}
	for k := range added {
		ours[k] = true
	}
	// With a layout chosen, the marker lists the volumes injected now (a
	// marker the pod brought along names anything the pod's author liked).
	if prev, _ := inject.PreviousInjection(pod); prev != nil && res.Layout != nil {
		for _, v := range prev.Volumes {
			ours[v] = true
		}
	}
	for _, c := range inject.AllContainers(pod) {
		for _, vm := range c.VolumeMounts {
			if ours[vm.Name] && !vm.ReadOnly {
				t.Fatalf("container %q mounts the injected volume %q read-write", c.Name, vm.Name)
			}
		}
	}

	after := pod.DeepCopy()
	in.Pod = after
	res2 := inject.Mutate(in, cfg)
	if !apiequality.Semantic.DeepEqual(after, pod) {
		a, _ := json.Marshal(pod)
		b, _ := json.Marshal(after)
		t.Fatalf("a second run changed the pod:\n%s\n%s", a, b)
	}
	if res2.Decision == inject.DecisionInjected || len(res2.Patch) > 0 {
		t.Fatalf("a second run reports a change: %d patch operations", len(res2.Patch))
	}
}

// CheckUnchangedUnlessInjected checks what Mutate promises of every pod, the
// golden cases' and the fuzzed ones alike: a denied or skipped pod is left
// as it came, its JSON byte for byte, with no edit and no patch, and a denial
// says why; an injected pod comes with a patch. before is a copy of the pod
// as it came, after the pod Mutate was given.
func CheckUnchangedUnlessInjected(t testing.TB, before, after *corev1.Pod, res inject.Result) {
	t.Helper()
	switch res.Decision {
	case inject.DecisionDenied, inject.DecisionSkipped:
		if len(res.Patch) > 0 || len(res.Edits) > 0 {
			t.Fatalf("a %s pod has %d edits and %d patch operations (reason %q)", res.Decision, len(res.Edits), len(res.Patch), res.Reason)
		}
		a, errA := json.Marshal(before)
		b, errB := json.Marshal(after)
		if err := errors.Join(errA, errB); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) || !apiequality.Semantic.DeepEqual(before, after) {
			t.Fatalf("a %s pod was changed (reason %q):\n%s\n%s", res.Decision, res.Reason, a, b)
		}
		if res.Decision == inject.DecisionDenied && res.Reason == "" {
			t.Fatalf("denied without a reason")
		}
	case inject.DecisionInjected:
		if len(res.Patch) == 0 {
			t.Fatalf("decision %s without a patch", res.Decision)
		}
	default:
		t.Fatalf("unknown decision %q", res.Decision)
	}
}

// CheckPatch applies the JSON Patch to the pod's JSON, as the API server
// does, and compares with the pod Mutate changed in place.
func CheckPatch(t *testing.T, before, after *corev1.Pod, ops []jsonpatch.Operation) {
	t.Helper()
	orig, err := json.Marshal(before)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatchv5.DecodePatch(raw)
	if err != nil {
		t.Fatalf("the patch does not decode: %v\n%s", err, raw)
	}
	out, err := patch.Apply(orig)
	if err != nil {
		t.Fatalf("the patch does not apply: %v\n%s\nto %s", err, raw, orig)
	}
	var patched corev1.Pod
	if err := json.Unmarshal(out, &patched); err != nil {
		t.Fatalf("the patched pod does not decode: %v", err)
	}
	if !apiequality.Semantic.DeepEqual(&patched, after) {
		want, _ := json.Marshal(after)
		t.Fatalf("the patch makes another pod than the mutation:\npatch %s\npatched %s\nmutated %s", raw, out, want)
	}
}

// CheckPlanSafe restates the security rule for node layouts independently of
// Validate: clean absolute host paths, none into the kernel's views, each
// inside the allowlist.
func CheckPlanSafe(t *testing.T, p layout.Plan, cfg *config.Configuration) {
	t.Helper()
	for _, m := range p.Mounts {
		hp := m.HostPath
		if hp == "/" || !path.IsAbs(hp) || path.Clean(hp) != hp || strings.ContainsAny(hp, "\x00\n") {
			t.Fatalf("plan mounts host path %q", hp)
		}
		for _, el := range strings.Split(hp, "/") {
			if el == "proc" || el == "sys" || el == "dev" || el == ".." {
				t.Fatalf("plan mounts host path %q", hp)
			}
		}
		if !allowed(hp, m.Kind, cfg) {
			t.Fatalf("plan mounts %s (%s), outside the allowlist", hp, m.Kind)
		}
		if !strings.HasPrefix(m.ContainerPath+"/", cfg.ContainerPaths.LibraryDir+"/") && !strings.HasPrefix(m.ContainerPath+"/", cfg.ContainerPaths.BinaryDir+"/") {
			t.Fatalf("plan mounts into %s, outside the container folders", m.ContainerPath)
		}
	}
}

// allowed: a folder entry covers itself and everything below it; a
// files-only entry covers driver files directly inside it.
func allowed(p string, kind layout.MountKind, cfg *config.Configuration) bool {
	for _, a := range cfg.HostPaths.Entries() {
		if a.FilesOnly {
			if ok, _ := path.Match(a.Path, path.Dir(p)); !ok || kind != layout.KindFile {
				continue
			}
			for _, pat := range cfg.HostPaths.DriverFilePatterns {
				if ok, _ := path.Match(pat, path.Base(p)); ok {
					return true
				}
			}
			continue
		}
		for q := p; q != "/" && q != "."; q = path.Dir(q) {
			if ok, _ := path.Match(a.Path, q); ok {
				return true
			}
		}
	}
	return false
}

// SplitDocs splits multi-document YAML, leaving out documents of comments only.
func SplitDocs(t testing.TB, data []byte) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("failed to split YAML: %v", err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// LoadNodes reads the Nodes of a YAML file.
func LoadNodes(t testing.TB, file string) []corev1.Node {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []corev1.Node
	for _, doc := range SplitDocs(t, data) {
		var n corev1.Node
		if err := yaml.UnmarshalStrict(doc, &n); err != nil {
			t.Fatalf("failed to parse node in %s: %v", file, err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// checkRuntimeMarker: a pod injected at the runtime names in its marker only
// containers it has, and requires the NRI plugin for each; a pod given
// hostPath volumes carries no marker, whatever its author wrote.
func checkRuntimeMarker(t *testing.T, pod *corev1.Pod, res inject.Result) {
	t.Helper()
	if res.Layout == nil {
		return
	}
	marker, marked := pod.Annotations[layout.AnnotationRuntimeInject]
	if !res.Layout.Runtime {
		if marked {
			t.Fatalf("a pod given hostPath volumes keeps the runtime marker %q", marker)
		}
		return
	}
	names, err := layout.ParseRuntimeMarker(marker)
	if err != nil {
		t.Fatalf("the runtime marker the webhook wrote does not parse: %v", err)
	}
	for _, n := range names {
		if !slices.ContainsFunc(inject.AllContainers(pod), func(c *corev1.Container) bool { return c.Name == n }) {
			t.Fatalf("the runtime marker names %q, no container of the pod", n)
		}
		key := layout.AnnotationNRIRequiredPlugins + "/container." + n
		if _, ok := pod.Annotations[key]; !ok {
			key = layout.AnnotationNRIRequiredPlugins + "/pod"
		}
		if !strings.Contains(pod.Annotations[key], layout.NRIPluginName) {
			t.Fatalf("container %q is marked but %s does not require %s", n, key, layout.NRIPluginName)
		}
	}
	if fp, ok := pod.Spec.NodeSelector[layout.LabelFingerprint]; ok {
		if prev, _ := inject.PreviousInjection(pod); prev == nil || prev.Runtime == "" {
			t.Fatalf("a pod injected at the runtime is pinned to layout %s", fp)
		}
	}
}
