package podstatus

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
)

// writeFile writes objects as a multi-document YAML file.
func writeFile(t *testing.T, objs ...any) string {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	f := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func typed[T any](apiVersion, kind string, o T) map[string]any {
	b, err := yaml.Marshal(o)
	if err != nil {
		panic(err)
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	m["apiVersion"], m["kind"] = apiVersion, kind
	return m
}

func nodeDoc(n *corev1.Node) map[string]any     { return typed("v1", "Node", n) }
func podDoc(p *corev1.Pod) map[string]any       { return typed("v1", "Pod", p) }
func nsDoc(ns *corev1.Namespace) map[string]any { return typed("v1", "Namespace", ns) }
func draDoc(kind string, o any) map[string]any  { return typed("resource.k8s.io/v1", kind, o) }
func baseline() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}}}
}

// TestStatusPodOffline: `status pod -f` explains a pod from files alone,
// through the webhook's builder of its input: the Namespace's Pod Security
// level, the nodes (a `nodeprobe --once` node named for its missing Ready
// condition), the DRA claims, the pod's own node; no API server is
// contacted (the Collector has no client to contact one with).
func TestStatusPodOffline(t *testing.T) {
	hostPathNode := gpuNode(t, "gpu-1", plan, nil)
	delete(hostPathNode.Labels, layout.LabelNRIPlugin)
	once := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: hostPathNode.Labels, Annotations: hostPathNode.Annotations}}
	deny := config.Default()
	deny.PodSecurity = config.PodSecurityDeny
	claimPod := gpuPod("claims")
	claimPod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	claimPod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("one-gpu")}}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: "ml"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}}}}

	for name, tc := range map[string]struct {
		objs      []any
		cfg       *config.Configuration
		target    string
		decision  string
		note      string
		warning   string
		attention []string
	}{
		"a manifest in a baseline namespace, podSecurity Deny": {
			objs: []any{nsDoc(baseline()), nodeDoc(hostPathNode), podDoc(gpuPod("train"))}, cfg: deny, target: "train",
			decision: "Denied", attention: []string{`the webhook would refuse it now: gpu-injector: namespace "ml" enforces Pod Security level "baseline"`},
		},
		"a manifest in a baseline namespace, podSecurity Warn": {
			objs: []any{nsDoc(baseline()), nodeDoc(hostPathNode), podDoc(gpuPod("train"))}, target: "train",
			decision: "Injected", warning: "the API server will reject this pod",
		},
		"the node as nodeprobe --once prints it": {
			objs: []any{podDoc(gpuPod("train")), nodeDoc(once)}, cfg: hostPathOnly(), target: "train",
			decision: "Denied", note: "node gpu-1 has no Ready condition: ",
			attention: []string{"the webhook would refuse it now: gpu-injector: no ready GPU node layout fits this pod"},
		},
		"a GPU claim beside the pod": {
			objs: []any{podDoc(claimPod), draDoc("ResourceClaim", claim), nodeDoc(hostPathNode)}, cfg: hostPathOnly(), target: "claims",
			decision: "Injected",
		},
		"the claim not given": {
			objs: []any{podDoc(claimPod), nodeDoc(hostPathNode)}, cfg: hostPathOnly(), target: "claims",
			decision: "Skipped",
		},
		"a running pod and its node": {
			objs: []any{podDoc(injected("train", "gpu-1", plan)), nodeDoc(gpuNode(t, "gpu-1", plan, nil))}, target: "train",
		},
		"a running pod, its node not given": {
			objs: []any{podDoc(injected("train", "gpu-2", plan)), nodeDoc(gpuNode(t, "gpu-1", plan, nil))}, target: "train",
			attention: []string{"its node gpu-2 is in none of the files given"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			files, err := ReadFiles(writeFile(t, tc.objs...), nil)
			if err != nil {
				t.Fatal(err)
			}
			files.Config = tc.cfg
			r, err := (&Collector{Files: files}).Collect(context.Background(), "ml", tc.target)
			if err != nil {
				t.Fatal(err)
			}
			switch a := r.Admission; {
			case tc.decision == "" && a != nil:
				t.Errorf("decided a running pod again: %+v", a)
			case tc.decision != "" && (a == nil || a.Decision != tc.decision):
				t.Fatalf("admission now %+v, want %s", a, tc.decision)
			case tc.decision != "" && (!strings.Contains(a.Note, tc.note) || !strings.Contains(strings.Join(a.Warnings, "\n"), tc.warning)):
				t.Errorf("admission now %+v, want the note %q and the warning %q", a, tc.note, tc.warning)
			}
			all := strings.Join(r.Attention, "\n")
			for _, want := range tc.attention {
				if !strings.Contains(all, want) {
					t.Errorf("attention:\n%s\nwant %q", all, want)
				}
			}
			if len(tc.attention) == 0 && all != "" {
				t.Errorf("attention:\n%s\nwant none", all)
			}
		})
	}
}

// TestRunOffline: Run with -f reads no kubeconfig (there is none to read),
// takes the file's one pod, and wants a name when the file holds several.
func TestRunOffline(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	one := writeFile(t, nsDoc(baseline()), podDoc(gpuPod("train")))
	var out bytes.Buffer
	code, err := Run(context.Background(), Options{File: one, Output: "table"}, &out)
	if err != nil || code == status.ExitError {
		t.Fatalf("exit %d: %v\n%s", code, err, out.String())
	}
	if !strings.Contains(out.String(), "POD") || !strings.Contains(out.String(), "ml/train  NotCreated") || !strings.Contains(out.String(), "WEBHOOK NOW") {
		t.Errorf("table:\n%s", out.String())
	}
	two := writeFile(t, podDoc(gpuPod("a")), podDoc(gpuPod("b")))
	if _, err := Run(context.Background(), Options{File: two, Output: "table"}, &out); !errors.Is(err, ErrWhichPod) {
		t.Errorf("two pods, none named: %v, want ErrWhichPod", err)
	}
	if _, err := Run(context.Background(), Options{File: two, PodNamespace: "ml", PodName: "c", Output: "table"}, &out); !errors.Is(err, ErrNotFound) {
		t.Errorf("a pod not in the file: %v, want ErrNotFound", err)
	}
	notPod := writeFile(t, typed("v1", "Service", &corev1.Service{}), podDoc(gpuPod("a")))
	if _, err := Run(context.Background(), Options{File: notPod, Output: "table"}, &out); err == nil || !strings.Contains(err.Error(), `document 1 is a "Service"`) {
		t.Errorf("a Service in the file: %v", err)
	}
}

func hostPathOnly() *config.Configuration {
	c := config.Default()
	c.DriverDelivery = config.DeliveryHostPath
	return c
}
