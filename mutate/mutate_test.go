package mutate

import (
	"bytes"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

const nodesFile = "../webhook/inject/testdata/nodes.yaml"

// runMutate mutates file ("-" for stdin) against the Nodes of nodes.
func runMutate(t *testing.T, stdin, file string, nodes ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := Run(Options{File: file, NodeFiles: nodes}, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), err
}

func docs(t *testing.T, s string) []string {
	t.Helper()
	parts, _, err := offline.SplitDocuments([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}

// TestClassicManifests is the "done means": the classic nvidia-smi
// Job (legacy limit, no mounts) comes out with nvidia.com/gpu, read-only
// mounts of the node's driver paths, LD_LIBRARY_PATH and the fingerprint
// node selector.
func TestClassicManifests(t *testing.T) {
	out, stderr, err := runMutate(t, "", "testdata/classic.yaml", nodesFile)
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	d := docs(t, out)
	if len(d) != 4 {
		t.Fatalf("got %d documents, want 4:\n%s", len(d), out)
	}

	var job batchv1.Job
	if err := yaml.UnmarshalStrict([]byte(d[0]), &job); err != nil {
		t.Fatal(err)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if _, ok := c.Resources.Limits["alpha.kubernetes.io/nvidia-gpu"]; ok {
		t.Errorf("legacy limit kept: %v", c.Resources.Limits)
	}
	if q := c.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
		t.Errorf("nvidia.com/gpu = %v, want 1", q.String())
	}
	mounts := map[string]bool{}
	for _, vm := range c.VolumeMounts {
		if !vm.ReadOnly {
			t.Errorf("mount %s is not read-only", vm.MountPath)
		}
		mounts[vm.MountPath] = true
	}
	if !mounts["/usr/local/nvidia/lib64"] || !mounts["/usr/local/nvidia/bin"] {
		t.Errorf("mounts = %v, want the driver's lib64 and bin", mounts)
	}
	hostPaths := map[string]bool{}
	for _, v := range job.Spec.Template.Spec.Volumes {
		hostPaths[v.HostPath.Path] = true
	}
	if !hostPaths["/usr/lib/nvidia-384"] || !hostPaths["/usr/lib/nvidia-384/bin"] {
		t.Errorf("host paths = %v, want the nvidia-384 layout's", hostPaths)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "LD_LIBRARY_PATH" || c.Env[0].Value != "/usr/local/nvidia/lib64" {
		t.Errorf("env = %v", c.Env)
	}
	if fp := job.Spec.Template.Spec.NodeSelector[layout.LabelFingerprint]; fp != "03b3b0fb0c0413aeadfa" {
		t.Errorf("fingerprint selector = %q", fp)
	}
	if !strings.Contains(stderr, "renamed to nvidia.com/gpu") {
		t.Errorf("stderr lacks the rename warning:\n%s", stderr)
	}

	if !strings.Contains(d[1], "# left exactly as written") {
		t.Errorf("the Service was rewritten:\n%s", d[1])
	}

	var dep appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte(d[2]), &dep); err != nil {
		t.Fatal(err)
	}
	if len(dep.Spec.Template.Spec.Volumes) != 2 || dep.Spec.Template.Labels["app"] != "tensorflow" {
		t.Errorf("deployment template not injected or labels lost: %+v", dep.Spec.Template)
	}

	var cj batchv1.CronJob
	if err := yaml.UnmarshalStrict([]byte(d[3]), &cj); err != nil {
		t.Fatal(err)
	}
	ps := cj.Spec.JobTemplate.Spec.Template.Spec
	if ps.NodeSelector[layout.LabelFingerprint] != "af5330373fdfca473dfb" || len(ps.Volumes) != 5 {
		t.Errorf("cronjob: want the a100 layout's 5 file mounts, got selector %v and %d volumes", ps.NodeSelector, len(ps.Volumes))
	}
	if cj.Spec.Schedule != "0 3 * * *" {
		t.Errorf("schedule lost: %q", cj.Spec.Schedule)
	}

	// Mutating the output again changes nothing.
	again, stderr2, err := runMutate(t, out, "-", nodesFile)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, stderr2)
	}
	if again != out {
		t.Errorf("second run changed the output")
	}
}

func TestJSONListAndKubectlNodes(t *testing.T) {
	// `kubectl get nodes -o json` and `kubectl get pods -o json` give Lists.
	nodes := loadNodeList(t)
	dir := t.TempDir()
	nf := filepath.Join(dir, "nodes.json")
	if err := os.WriteFile(nf, nodes, 0o644); err != nil {
		t.Fatal(err)
	}
	in := `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}},{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm"}}]}`
	out, stderr, err := runMutate(t, in, "-", nf)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.HasPrefix(out, "{") || !strings.Contains(out, `"gpu-injector.io/layout-fingerprint"`) {
		t.Errorf("want JSON with the fingerprint selector, got:\n%s", out)
	}
	if !strings.Contains(out, `"ConfigMap"`) {
		t.Errorf("the ConfigMap item was lost:\n%s", out)
	}
}

func loadNodeList(t *testing.T) []byte {
	t.Helper()
	nodes, err := readNodes(nodesFile)
	if err != nil {
		t.Fatal(err)
	}
	list := corev1.NodeList{Items: nodes}
	list.APIVersion, list.Kind = "v1", "List"
	b, err := yaml.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata: [unclosed\n"), 0o644)
	notNode := filepath.Join(dir, "notnode.yaml")
	os.WriteFile(notNode, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"), 0o644)
	noKind := filepath.Join(dir, "nokind.yaml")
	os.WriteFile(noKind, []byte("metadata: {name: p}\n"), 0o644)
	deny := filepath.Join(dir, "deny.yaml")
	os.WriteFile(deny, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeSelector: {accelerator: none}\n  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"), 0o644)

	tests := map[string]struct {
		opts    Options
		wantErr string
		denied  bool
	}{
		"unparsable input": {opts: Options{File: bad, NodeFiles: []string{nodesFile}}, wantErr: "failed to mutate document 1 of " + bad},
		"missing file":     {opts: Options{File: filepath.Join(dir, "nope.yaml"), NodeFiles: []string{nodesFile}}, wantErr: "no such file"},
		"nodes not nodes":  {opts: Options{File: deny, NodeFiles: []string{notNode}}, wantErr: `document 1 is a "Pod", not a Node`},
		"no kind":          {opts: Options{File: noKind, NodeFiles: []string{nodesFile}}, wantErr: "document has no kind"},
		// hostPath only: the default delivery admits a pod no known node fits.
		"denied is an error": {opts: Options{File: deny, NodeFiles: []string{nodesFile}, Config: hostPathOnly()}, wantErr: "would deny", denied: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := Run(tc.opts, strings.NewReader(""), &out, &errb)
			stderr := errb.String()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q\n%s", err, tc.wantErr, stderr)
			}
			if errors.Is(err, ErrDenied) != tc.denied {
				t.Errorf("errors.Is(ErrDenied) = %v", !tc.denied)
			}
			if tc.denied && !strings.Contains(stderr, "denied: Pod/p: gpu-injector: no ready GPU node layout fits") {
				t.Errorf("stderr lacks the denial:\n%s", stderr)
			}
		})
	}
}

// TestKeepsWhatItDoesNotKnow: fields the typed round trip does not know stay
// in the output, in pods and in templates alike.
func TestKeepsWhatItDoesNotKnow(t *testing.T) {
	in := `apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: ml}
spec:
  futureDeploymentField: 1
  selector: {matchLabels: {app: d}}
  template:
    spec:
      futureSpecField: {enabled: true}
      containers:
      - name: c
        image: x
        futureContainerField: keep
        resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  futurePodField: keep
  containers:
  - name: c
    image: x
    resources: {limits: {nvidia.com/gpu: 1}}
`
	out, stderr, err := runMutate(t, in, "-", nodesFile)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"futureDeploymentField: 1", "futureSpecField:", "futureContainerField: keep", "futurePodField: keep", "gpu-injector.io/layout-fingerprint"} {
		if strings.Count(out, want) < 1 {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "gpu-injector.io/layout-fingerprint") != 2 {
		t.Errorf("want both documents injected:\n%s", out)
	}
	if strings.Contains(out, "creationTimestamp") {
		t.Errorf("output gained creationTimestamp noise:\n%s", out)
	}
}

// gkeNodes writes the golden cluster's GKE nodes alone, every GPU node
// tainted nvidia.com/gpu=present:NoSchedule, as `kubectl get nodes -o yaml`
// would on such a cluster.
func gkeNodes(t *testing.T) string {
	t.Helper()
	nodes, err := readNodes(nodesFile)
	if err != nil {
		t.Fatal(err)
	}
	list := corev1.NodeList{}
	list.APIVersion, list.Kind = "v1", "List"
	for _, n := range nodes {
		if strings.HasPrefix(n.Name, "gpu-gke-") {
			list.Items = append(list.Items, n)
		}
	}
	b, err := yaml.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "gke-nodes.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLegacyJobOnTaintedPool: the classic nvidia-smi Job, offline, on a
// cluster whose GPU nodes are all tainted: renamed, given the toleration the
// ExtendedResourceToleration admission plugin gives a pod requesting
// nvidia.com/gpu, injected; and the same again changes nothing.
func TestLegacyJobOnTaintedPool(t *testing.T) {
	nodes := gkeNodes(t)
	in := `apiVersion: batch/v1
kind: Job
metadata: {name: nvidia-smi, namespace: ml}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: nvidia-smi
        image: nvidia/cuda:9.0-base
        command: ["nvidia-smi"]
        resources:
          limits:
            alpha.kubernetes.io/nvidia-gpu: 1
`
	out, stderr, err := runMutate(t, in, "-", nodes)
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	var job batchv1.Job
	if err := yaml.UnmarshalStrict([]byte(out), &job); err != nil {
		t.Fatal(err)
	}
	ps := job.Spec.Template.Spec
	want := []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if !reflect.DeepEqual(ps.Tolerations, want) {
		t.Errorf("tolerations = %+v, want %+v", ps.Tolerations, want)
	}
	if ps.NodeSelector[layout.LabelFingerprint] != "c7533112b3c59a93fcb3" || len(ps.Volumes) != 2 {
		t.Errorf("want the GKE layout injected, got selector %v and %d volumes", ps.NodeSelector, len(ps.Volumes))
	}
	if !strings.Contains(stderr, "added the toleration {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}") {
		t.Errorf("stderr lacks the toleration in the rename warning:\n%s", stderr)
	}
	again, stderr2, err := runMutate(t, out, "-", nodes)
	if err != nil || again != out {
		t.Errorf("second run: %v, changed=%v\n%s", err, again != out, stderr2)
	}
}

// TestReinjectsStaleTemplates: a Deployment and a Job that `gpu-injector
// mutate` injected when the A100 nodes ran driver 535.104.05 (the pod of the
// golden case reinject-driver-upgrade, as their template), mutated again
// after the nodes moved to 550.54.15: re-injected, the user's volumes, mounts,
// env and selector kept, the old and the new driver named; and mutating the
// output once more changes nothing.
func TestReinjectsStaleTemplates(t *testing.T) {
	data, err := os.ReadFile("../webhook/inject/testdata/reinject-driver-upgrade.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(data, &pod); err != nil {
		t.Fatal(err)
	}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec}
	dep := appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: pod.Labels}, Template: tmpl},
	}
	job := batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec:       batchv1.JobSpec{Template: *tmpl.DeepCopy()},
	}
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	var in bytes.Buffer
	for i, obj := range []any{dep, job} {
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			in.WriteString("---\n")
		}
		in.Write(b)
	}
	out, stderr, err := runMutate(t, in.String(), "-", nodesFile)
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	if n := strings.Count(stderr, "the pod carried the NVIDIA driver 535.104.05 of layout 1e49946eca20757e2b51, which no ready node the pod may use publishes now; re-injected with driver 550.54.15 of layout af5330373fdfca473dfb"); n != 2 {
		t.Errorf("want the re-injection warning for both documents, got %d:\n%s", n, stderr)
	}
	d := docs(t, out)
	if len(d) != 2 {
		t.Fatalf("got %d documents, want 2:\n%s", len(d), out)
	}
	var gotDep appsv1.Deployment
	var gotJob batchv1.Job
	if err := yaml.UnmarshalStrict([]byte(d[0]), &gotDep); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(d[1]), &gotJob); err != nil {
		t.Fatal(err)
	}
	for kind, ps := range map[string]corev1.PodSpec{"Deployment": gotDep.Spec.Template.Spec, "Job": gotJob.Spec.Template.Spec} {
		hostPaths := map[string]string{}
		for _, v := range ps.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
			}
		}
		for name, p := range hostPaths {
			if strings.Contains(p, "535.104.05") {
				t.Errorf("%s: volume %s still mounts the old driver's %s", kind, name, p)
			}
		}
		if hostPaths["data"] != "/data" || !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == "scratch" && v.EmptyDir != nil }) {
			t.Errorf("%s: the user's volumes changed: %+v", kind, ps.Volumes)
		}
		if !slices.Contains(slices.Collect(maps.Values(hostPaths)), "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15") {
			t.Errorf("%s: the new driver's libcuda is not mounted: %v", kind, hostPaths)
		}
		c := ps.Containers[0]
		if c.VolumeMounts[0].Name != "data" || c.VolumeMounts[1].Name != "scratch" || len(c.VolumeMounts) != 7 {
			t.Errorf("%s: mounts = %+v", kind, c.VolumeMounts)
		}
		if len(c.Env) != 2 || c.Env[0].Value != "/opt/conda/lib:/usr/local/nvidia/lib64" || c.Env[1].Name != "EPOCHS" {
			t.Errorf("%s: env = %+v", kind, c.Env)
		}
		if want := map[string]string{"accelerator": "nvidia-a100", layout.LabelFingerprint: "af5330373fdfca473dfb"}; !reflect.DeepEqual(ps.NodeSelector, want) {
			t.Errorf("%s: nodeSelector = %v, want %v", kind, ps.NodeSelector, want)
		}
	}
	again, stderr2, err := runMutate(t, out, "-", nodesFile)
	if err != nil || again != out {
		t.Errorf("second run: %v, changed=%v\n%s", err, again != out, stderr2)
	}
}

// TestDemoManifestsOnNRINodes runs the demo's classic manifests, written
// before runtime injection existed, against a cluster where some nodes run
// gpu-injector's NRI plugin: the K80 pod, whose nodes all have the plugin,
// is marked for it and gets no hostPath; the nvidia-smi Job, which may land
// on nodes without it, gets hostPath volumes and no marker; a second run
// changes nothing.
func TestDemoManifestsOnNRINodes(t *testing.T) {
	const nriNodes = "../webhook/inject/testdata/nodes-nri.yaml"
	for name, tc := range map[string]struct {
		file    string
		runtime bool
	}{
		"k80 pod, every node it can use has the plugin": {"cuda-check-k80.yaml", true},
		"nvidia-smi Job, some nodes without the plugin": {"nvidia-smi-job.yaml", false},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join("..", "hack", "demo", "manifests", tc.file)
			out, stderr, err := runMutate(t, "", file, nriNodes)
			if err != nil {
				t.Fatalf("mutate: %v\n%s", err, stderr)
			}
			var obj struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
				Spec     struct {
					corev1.PodSpec
					Template corev1.PodTemplateSpec `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(out), &obj); err != nil {
				t.Fatal(err)
			}
			meta, spec := obj.Metadata, obj.Spec.PodSpec
			if len(obj.Spec.Template.Spec.Containers) > 0 {
				meta, spec = obj.Spec.Template.ObjectMeta, obj.Spec.Template.Spec
			}
			hostPaths := 0
			for _, v := range spec.Volumes {
				if v.HostPath != nil {
					hostPaths++
				}
			}
			marker, marked := meta.Annotations[layout.AnnotationRuntimeInject]
			if tc.runtime && (!marked || hostPaths > 0) {
				t.Errorf("marker %q (present %v), %d hostPath volumes: want the marker and none", marker, marked, hostPaths)
			}
			if !tc.runtime && (marked || hostPaths == 0) {
				t.Errorf("marker %q (present %v), %d hostPath volumes: want hostPath volumes and no marker", marker, marked, hostPaths)
			}
			again, stderr2, err := runMutate(t, out, "-", nriNodes)
			if err != nil {
				t.Fatalf("second run: %v\n%s", err, stderr2)
			}
			if again != out {
				t.Errorf("a second run changed the output")
			}
		})
	}
}

// TestPoolAtZero: a pod for a GPU pool with no node yet is admitted for
// runtime injection, marked, with no pin and no LD_LIBRARY_PATH, both with
// driverDelivery: Runtime in a cluster with no GPU node at all and with the
// default delivery in a cluster whose GPU nodes run the NRI plugin; a second
// run changes nothing.
func TestPoolAtZero(t *testing.T) {
	runtimeDelivery, err := config.Load("testdata/runtime-delivery.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		nodes string
		cfg   *config.Configuration
	}{
		"driverDelivery Runtime, no GPU node":     {nodes: "testdata/cpu-nodes.yaml", cfg: runtimeDelivery},
		"default delivery, nodes with the plugin": {nodes: "../webhook/inject/testdata/nodes-nri.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			mutate := func(stdin, file string) (string, string, error) {
				var out, errb bytes.Buffer
				err := Run(Options{File: file, NodeFiles: []string{tc.nodes}, Config: tc.cfg}, strings.NewReader(stdin), &out, &errb)
				return out.String(), errb.String(), err
			}
			out, stderr, err := mutate("", "testdata/pool-at-zero.yaml")
			if err != nil {
				t.Fatalf("mutate: %v\n%s", err, stderr)
			}
			if !strings.Contains(stderr, "injected: Pod/train: at the runtime") {
				t.Errorf("stderr does not say the pod is injected at the runtime:\n%s", stderr)
			}
			var pod corev1.Pod
			if err := yaml.UnmarshalStrict([]byte(out), &pod); err != nil {
				t.Fatal(err)
			}
			if want := "train"; pod.Annotations[layout.AnnotationRuntimeInject] != want {
				t.Errorf("marker %q, want %q", pod.Annotations[layout.AnnotationRuntimeInject], want)
			}
			if want := map[string]string{"karpenter.sh/nodepool": "gpu-big"}; !maps.Equal(pod.Spec.NodeSelector, want) {
				t.Errorf("nodeSelector %v, want the pod's own %v", pod.Spec.NodeSelector, want)
			}
			if env := pod.Spec.Containers[0].Env; len(env) > 0 || len(pod.Spec.Volumes) > 0 {
				t.Errorf("env %v, volumes %v: want neither", env, pod.Spec.Volumes)
			}
			again, stderr2, err := mutate(out, "-")
			if err != nil || again != out {
				t.Errorf("second run: %v, changed=%v\n%s", err, again != out, stderr2)
			}
		})
	}
}

// hostPathOnly is the default configuration with driverDelivery: HostPath.
func hostPathOnly() *config.Configuration {
	c := config.Default()
	c.DriverDelivery = config.DeliveryHostPath
	return c
}

// readNodes reads the Nodes of a file of the cluster.
func readNodes(file string) ([]corev1.Node, error) {
	var c offline.Cluster
	err := c.AddFile(file, nil)
	return c.Nodes, err
}
