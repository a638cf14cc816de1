package webhook

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatchv5 "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// fuzzWorld is what the golden cases hold, loaded once per fuzzing process:
// their configurations, namespace labels, and every node of the golden
// clusters (hostile ones included).
type fuzzWorld struct {
	cfgs     []*config.Configuration
	layouts  [][]*Layout // layouts[i] are the nodes' layouts under cfgs[i]
	nsLabels []map[string]string
	pods     [][]byte // JSON
	nodes    []corev1.Node
}

func loadFuzzWorld(tb testing.TB) *fuzzWorld {
	tb.Helper()
	w := &fuzzWorld{cfgs: []*config.Configuration{config.Default()}, nsLabels: []map[string]string{nil}}
	for _, f := range []string{"nodes.yaml", "nodes-hostile.yaml"} {
		w.nodes = append(w.nodes, loadNodes(tb, filepath.Join("testdata", f))...)
	}
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	for _, in := range inputs {
		if strings.HasPrefix(filepath.Base(in), "nodes") {
			continue
		}
		data, err := os.ReadFile(in)
		if err != nil {
			tb.Fatal(err)
		}
		for _, doc := range splitDocs(tb, data) {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				tb.Fatalf("%s: %v", in, err)
			}
			switch meta.Kind {
			case config.Kind:
				cfg, err := config.Parse(doc)
				if err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.cfgs = append(w.cfgs, cfg)
			case "Namespace":
				var ns corev1.Namespace
				if err := yaml.Unmarshal(doc, &ns); err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.nsLabels = append(w.nsLabels, ns.Labels)
			case "Pod":
				j, err := yaml.YAMLToJSON(doc)
				if err != nil {
					tb.Fatalf("%s: %v", in, err)
				}
				w.pods = append(w.pods, j)
			}
		}
	}
	for _, cfg := range w.cfgs {
		w.layouts = append(w.layouts, layoutsOf(cfg, w.nodes))
	}
	return w
}

// FuzzMutate feeds arbitrary Pods (as JSON, the webhook's input) to Mutate
// under each golden configuration and namespace, and checks what every
// mutation must keep: a denied or skipped pod is unchanged, every volume
// the mutation adds is a hostPath of the chosen layout inside the allowlist
// and mounted read-only wherever it is mounted, the pod's own volumes are
// untouched, and a second run changes nothing (a reinvocation, or the
// offline `gpu-injector mutate` run on its own output).
func FuzzMutate(f *testing.F) {
	w := loadFuzzWorld(f)
	for i, p := range w.pods {
		f.Add(p, uint8(i))
	}
	f.Add([]byte(`{"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}},"volumeMounts":[{"name":"gpu-injector-x","mountPath":"/usr/local/nvidia/lib64"}]}],"volumes":[{"name":"gpu-injector-x","emptyDir":{}}]}}`), uint8(0))
	f.Add([]byte(`{"metadata":{"annotations":{"gpu-injector.io/injected":"{\"fingerprint\":\"x\",\"volumes\":[\"v\"]}"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"alpha.kubernetes.io/nvidia-gpu":"2","nvidia.com/gpu":"1"}},"volumeMounts":[{"name":"v","mountPath":"/data"}]}],"volumes":[{"name":"v","hostPath":{"path":"/"}}]}}`), uint8(1))
	f.Fuzz(func(t *testing.T, podJSON []byte, sel uint8) {
		var pod corev1.Pod
		if err := json.Unmarshal(podJSON, &pod); err != nil {
			return
		}
		i := int(sel) % len(w.cfgs)
		cfg, layouts := w.cfgs[i], w.layouts[i]
		ns := w.nsLabels[int(sel/16)%len(w.nsLabels)]
		checkMutation(t, &pod, ns, layouts, cfg)
	})
}

// FuzzNodeLayout fuzzes what the webhook reads from a Node, which the node
// (or anyone who may write Nodes) controls: the layout annotation, the
// fingerprint and state labels, a label of its own, and the allocatable GPU
// count. The index must admit only layouts that validate and match their
// fingerprint, count GPUs within bounds, read the same from a Node its cache
// transform stripped, and any pod injected from what it admitted must get
// read-only hostPaths inside the allowlist.
func FuzzNodeLayout(f *testing.F) {
	byFP := config.Default()
	// With pinning by pool, the fuzzed node may join, split or mix the good
	// node's pool.
	byPool, err := config.Parse([]byte("pinning: {nodeLabels: [pool]}\n"))
	if err != nil {
		f.Fatal(err)
	}
	rules := byFP.Rules()
	good := ixNode("gpu-good", ixPlan("535.104.05"), 4, func(n *corev1.Node) { n.Labels["pool"] = "a" })
	pods := [][]byte{}
	for _, gpu := range []string{"nvidia.com/gpu", "alpha.kubernetes.io/nvidia-gpu"} {
		j, err := json.Marshal(hPod(gpu, nil))
		if err != nil {
			f.Fatal(err)
		}
		pods = append(pods, j)
	}
	pinned, err := json.Marshal(hPod("nvidia.com/gpu", func(p *corev1.Pod) { p.Spec.NodeName = "fuzzed" }))
	if err != nil {
		f.Fatal(err)
	}
	pods = append(pods, pinned)

	nodes := loadNodes(f, filepath.Join("testdata", "nodes.yaml"))
	nodes = append(nodes, loadNodes(f, filepath.Join("testdata", "nodes-hostile.yaml"))...)
	for i, n := range nodes {
		q := n.Status.Allocatable["nvidia.com/gpu"]
		f.Add(n.Annotations[layout.AnnotationLayout], n.Labels[layout.LabelFingerprint], n.Labels[layout.LabelState], q.String(), "accelerator=nvidia-tesla-k80", uint8(i))
		f.Add(n.Annotations[layout.AnnotationLayout], n.Labels[layout.LabelFingerprint], n.Labels[layout.LabelState], q.String(), "pool=a", uint8(i|4))
	}
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","runtimeInjection":"cdi"}`, "", layout.StateReady, "1", "", uint8(0))
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","mounts":[],"libraryPaths":[],"runtimeInjection":"device-plugin"}`, "", layout.StateReady, "1", "", uint8(0))
	f.Add(`{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/lib/nvidia-1/../../../etc","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}]}`, "x", layout.StateReady, "9223372036854775807", "", uint8(1))

	f.Fuzz(func(t *testing.T, ann, fp, state, gpus, label string, sel uint8) {
		cfg := byFP
		if sel&4 != 0 {
			cfg = byPool
		}
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        "fuzzed",
				Labels:      map[string]string{layout.LabelState: state, layout.LabelFingerprint: fp},
				Annotations: map[string]string{layout.AnnotationLayout: ann},
			},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		}
		if k, v, ok := strings.Cut(label, "="); ok {
			n.Labels[k] = v
		}
		// apimachinery v0.36's ParseQuantity takes time and memory
		// exponential in a decimal exponent's digits, and does not return on
		// one beyond int32 ("92E3372036854775807": it wraps, then rounds a
		// number of a billion digits; fixed upstream after v0.36). The API
		// server decodes a Node's allocatable with that parser before any
		// informer sees it, so such a count never reaches the index; it
		// would only stall this target. Two exponent digits are kept.
		if i := strings.IndexAny(gpus, "eE"); i >= 0 && len(gpus)-i > 4 {
			gpus = ""
		}
		if q, err := resource.ParseQuantity(gpus); err == nil {
			n.Status.Allocatable = corev1.ResourceList{"nvidia.com/gpu": q}
		}
		if sel&1 != 0 {
			n.Spec.Taints = []corev1.Taint{{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}}
		}

		idx := NewIndex(cfg, logr.Discard())
		idx.Update(good)
		idx.Update(n.DeepCopy())
		layouts := idx.Layouts()
		var fuzzedIn *Layout
		for _, l := range layouts {
			if l.Fingerprint != l.Plan.Fingerprint() {
				t.Fatalf("layout %s admitted under a fingerprint that is not its plan's (%s)", l.Fingerprint, l.Plan.Fingerprint())
			}
			if errs := l.Plan.Validate(rules); len(errs) > 0 {
				t.Fatalf("layout %s admitted with errors: %v", l.Fingerprint, errs.ToAggregate())
			}
			checkPlanSafe(t, l.Plan, cfg)
			if l.AllocatableGPUs < 0 || l.AllocatableGPUs > int64(len(l.Nodes))*MaxNodeGPUs {
				t.Fatalf("layout %s counts %d GPUs on %d nodes", l.Fingerprint, l.AllocatableGPUs, len(l.Nodes))
			}
			for _, ni := range l.Nodes {
				if ni.Name == "fuzzed" {
					fuzzedIn = l
				}
			}
		}
		if fuzzedIn != nil {
			if state != layout.StateReady || fuzzedIn.Fingerprint != fp {
				t.Fatalf("node with state %q and fingerprint label %q admitted under %s", state, fp, fuzzedIn.Fingerprint)
			}
			again, err := layout.Encode(fuzzedIn.Plan)
			if err != nil {
				t.Fatalf("failed to re-encode an admitted plan: %v", err)
			}
			if p, err := layout.Decode(again); err != nil || p.Fingerprint() != fp {
				t.Fatalf("an admitted plan does not survive a round trip: %v", err)
			}
		}

		// A streamed list hands the index nodes after Transform: it must
		// keep all the index reads.
		stripped, err := idx.Transform(n.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		idx2 := NewIndex(cfg, logr.Discard())
		idx2.Update(good)
		if err := (NodeStore{idx2}).Update(stripped); err != nil {
			t.Fatal(err)
		}
		if a, b := layoutSummary(layouts), layoutSummary(idx2.Layouts()); a != b {
			t.Fatalf("the transform changes what the index reads:\n%s\nvs\n%s", a, b)
		}
		// The same node again (a heartbeat) changes nothing; deleting it
		// leaves the good node's layout alone.
		idx.Update(n.DeepCopy())
		if a, b := layoutSummary(layouts), layoutSummary(idx.Layouts()); a != b {
			t.Fatalf("an unchanged node changed the index:\n%s\nvs\n%s", a, b)
		}
		idx.Delete("fuzzed")
		if got := idx.Layouts(); len(got) != 1 || len(got[0].Nodes) != 1 || got[0].Nodes[0].Name != "gpu-good" {
			t.Fatalf("after the fuzzed node is deleted: %s", layoutSummary(got))
		}

		var pod corev1.Pod
		if err := json.Unmarshal(pods[int(sel/8)%len(pods)], &pod); err != nil {
			t.Fatal(err)
		}
		checkMutation(t, &pod, nil, layouts, cfg)
	})
}

func layoutSummary(ls []*Layout) string {
	var b strings.Builder
	for _, l := range ls {
		b.WriteString(l.Fingerprint)
		for _, n := range l.Nodes {
			b.WriteString(" " + n.Name + "{")
			for k, v := range n.Labels.All() {
				b.WriteString(k + "=" + v + ",")
			}
			b.WriteString("}")
		}
		b.WriteString(" gpus=" + resource.NewQuantity(l.AllocatableGPUs, resource.DecimalSI).String() + "\n")
	}
	return b.String()
}

// checkMutation runs Mutate on pod and checks the properties every mutation
// keeps, then runs it again on the result.
func checkMutation(t *testing.T, pod *corev1.Pod, nsLabels map[string]string, layouts []*Layout, cfg *config.Configuration) {
	t.Helper()
	before := pod.DeepCopy()
	in := Input{Pod: pod, NamespaceLabels: nsLabels, Layouts: layouts, Seed: Seed(pod.Namespace + "/" + pod.Name)}
	res := Mutate(in, cfg)
	switch res.Decision {
	case DecisionDenied:
		// Callers drop a denied pod (the handler sends no patch, the
		// offline command prints the document as written), so what Mutate
		// left in it does not matter.
		if res.Reason == "" {
			t.Fatalf("denied without a reason")
		}
		return
	case DecisionSkipped:
		if len(res.Patch) > 0 || len(res.Edits) > 0 {
			t.Fatalf("a skipped pod has %d patch operations", len(res.Patch))
		}
		if !apiequality.Semantic.DeepEqual(before, pod) {
			a, _ := json.Marshal(before)
			b, _ := json.Marshal(pod)
			t.Fatalf("a %s pod was changed (reason %q):\n%s\n%s", res.Decision, res.Reason, a, b)
		}
		return
	case DecisionInjected:
	default:
		t.Fatalf("unknown decision %q", res.Decision)
	}

	// The patch the webhook sends makes the same pod out of the one it got.
	checkPatch(t, before, pod, res.Patch)

	// The pod's own volumes stay as they were; only a hand-written driver
	// mount (a hostPath) may go, replaced by the injected layout, and then
	// nothing mounts it any more. A volume an earlier injection's record
	// lists is not the pod's own: a re-injection may replace it.
	// A name may be given twice (the API server refuses that pod only after
	// admission): the k-th volume of a name is compared with the k-th.
	earlier, _ := previousInjection(before)
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
		for _, c := range allContainers(pod) {
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
	if res.Layout != nil && res.Layout.Static == "" {
		checkPlanSafe(t, res.Layout.Plan, cfg)
	}
	ours := map[string]bool{}
	for k := range added {
		ours[k] = true
	}
	// With a layout chosen, the marker lists the volumes injected now (a
	// marker the pod brought along names anything the pod's author liked).
	if prev, _ := previousInjection(pod); prev != nil && res.Layout != nil {
		for _, v := range prev.Volumes {
			ours[v] = true
		}
	}
	for _, c := range allContainers(pod) {
		for _, vm := range c.VolumeMounts {
			if ours[vm.Name] && !vm.ReadOnly {
				t.Fatalf("container %q mounts the injected volume %q read-write", c.Name, vm.Name)
			}
		}
	}

	after := pod.DeepCopy()
	in.Pod = after
	res2 := Mutate(in, cfg)
	if !apiequality.Semantic.DeepEqual(after, pod) {
		a, _ := json.Marshal(pod)
		b, _ := json.Marshal(after)
		t.Fatalf("a second run changed the pod:\n%s\n%s", a, b)
	}
	if res2.Decision == DecisionInjected || len(res2.Patch) > 0 {
		t.Fatalf("a second run reports a change: %d patch operations", len(res2.Patch))
	}
}

// checkPatch applies the JSON Patch to the pod's JSON, as the API server
// does, and compares with the pod Mutate changed in place.
func checkPatch(t *testing.T, before, after *corev1.Pod, ops []jsonpatch.Operation) {
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

// checkPlanSafe restates the security rule for node layouts independently of
// Validate: clean absolute host paths, none into the kernel's views, each
// inside the allowlist.
func checkPlanSafe(t *testing.T, p layout.Plan, cfg *config.Configuration) {
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
