package podstatus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpu-injector/gpu-injector/layout"
)

var plan = layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "550.54.15", CUDADriverVersion: "12.4",
	Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
	LibraryPaths: []string{"/usr/local/nvidia/lib64"}}

func gpuNode(t *testing.T, name string, p layout.Plan, annotations map[string]string) *corev1.Node {
	t.Helper()
	enc, err := layout.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{layout.LabelState: layout.StateReady, layout.LabelFingerprint: p.Fingerprint(),
			layout.LabelDriverVersion: p.DriverVersion, layout.LabelNRIPlugin: layout.NRIProtocol, "kubernetes.io/hostname": name},
		Annotations: map[string]string{layout.AnnotationLayout: enc}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	for k, v := range annotations {
		n.Annotations[k] = v
	}
	return n
}

func gpuPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: "uid-" + "name"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "gpu", Image: "cuda",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}}
}

// injected is a pod as the webhook leaves it with hostPath delivery, and as
// the kubelet runs it on node.
func injected(name, node string, p layout.Plan) *corev1.Pod {
	pod := gpuPod(name)
	pod.Annotations = map[string]string{layout.AnnotationInjected: fmt.Sprintf(`{"fingerprint":%q,"driverVersion":%q,"containers":["gpu"],"volumes":["gpu-injector-0"]}`,
		p.Fingerprint(), p.DriverVersion)}
	pod.Spec.NodeSelector = map[string]string{layout.LabelFingerprint: p.Fingerprint()}
	pod.Spec.Volumes = []corev1.Volume{{Name: "gpu-injector-0", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/local/nvidia/lib64"}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "gpu-injector-0", MountPath: "/usr/local/nvidia/lib64", ReadOnly: true}}
	if node != "" {
		pod.Spec.NodeName = node
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "gpu", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	} else {
		pod.Status = corev1.PodStatus{Phase: corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
				Message: "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."}}}
	}
	return pod
}

func optedIn() *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml", Labels: map[string]string{layout.LabelInject: layout.InjectEnabled}}}
}

func collectPod(t *testing.T, manifest *corev1.Pod, name string, objs ...runtime.Object) (*Report, error) {
	t.Helper()
	c := &Collector{Client: fake.NewClientset(append(objs, optedIn())...), Manifest: manifest}
	return c.Collect(context.Background(), "ml", name)
}

func TestStatusPod(t *testing.T) {
	upgraded := plan
	upgraded.DriverVersion = "570.86.10"
	staleOn := func(pods ...string) map[string]string {
		s := layout.StaleDriver{Containers: 2, StaleContainers: len(pods), StalePods: len(pods), Pods: pods}
		v, err := layout.EncodeStaleDriver(s)
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{layout.AnnotationStaleDriver: v}
	}
	refusedPod := gpuPod("refused")
	refusedPod.Annotations = map[string]string{layout.AnnotationInjected: `{"runtime":"nri","driverVersion":"","containers":["gpu"]}`,
		layout.AnnotationRuntimeInject: "gpu"}
	refusedPod.Spec.NodeName = "gpu-1"
	refusedPod.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "gpu", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError",
			Message: `failed to create containerd container: gpu-injector: container "gpu" of pod ml/refused requires of the driver NVIDIA_REQUIRE_CUDA="cuda>=13.0"`}}}}}
	// Without the NRI plugin anywhere.
	hostPathOnly := gpuNode(t, "gpu-1", plan, nil)
	delete(hostPathOnly.Labels, layout.LabelNRIPlugin)
	elsewhere := gpuPod("elsewhere")
	elsewhere.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "cpu-1"}
	// A pod whose GPU comes through a DRA claim, not a limit.
	claims := gpuPod("claims")
	claims.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
	claims.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("one-gpu")}}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: "ml"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}}}}

	for name, tc := range map[string]struct {
		objs      []runtime.Object
		manifest  *corev1.Pod
		pod       string
		delivery  string
		stillHas  bool
		stale     string
		decision  string
		attention []string
	}{
		"running, node unchanged": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", plan, staleOn()), injected("train", "gpu-1", plan)}, pod: "train",
			delivery: DeliveryHostPath, stillHas: true, stale: "no",
		},
		"running on a deleted driver": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", upgraded, staleOn("ml/train")), injected("train", "gpu-1", plan)}, pod: "train",
			delivery: DeliveryHostPath, stale: "yes",
			attention: []string{"no longer has what the pod got", "restart it"},
		},
		"running, node without a scan": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", plan, nil), injected("train", "gpu-1", plan)}, pod: "train",
			delivery: DeliveryHostPath, stillHas: true, stale: "unknown: the node's NRI plugin does not scan",
		},
		"pending on a layout no node has": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", upgraded, nil), injected("wait", "", plan)}, pod: "wait",
			delivery: DeliveryHostPath, stale: "unknown", decision: "Injected",
			attention: []string{"not scheduled: Unschedulable"},
		},
		"pending where no GPU node is": {
			objs: []runtime.Object{hostPathOnly, withStatus(elsewhere)}, pod: "elsewhere",
			delivery: DeliveryNone, stale: "unknown", decision: "Injected",
			attention: []string{"not scheduled: Unschedulable"},
		},
		"refused by the node's plugin": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", plan, staleOn()), refusedPod}, pod: "refused",
			delivery: DeliveryNRI, stillHas: true, stale: "no", decision: "Injected",
			attention: []string{`container gpu was refused at creation by the node's gpu-injector NRI plugin: failed to create containerd container: gpu-injector: container "gpu"`},
		},
		"pending, its GPU claimed through DRA": {
			objs: []runtime.Object{gpuNode(t, "gpu-1", plan, nil), withStatus(claims), claim}, pod: "claims",
			delivery: DeliveryNone, stale: "unknown", decision: "Injected",
			attention: []string{"not scheduled: Unschedulable"},
		},
		// The defaults admit a pod no known node fits, for the node that will.
		"no known node fits, from its manifest": {
			objs: []runtime.Object{hostPathOnly}, manifest: elsewhere, pod: "elsewhere",
			delivery: DeliveryNone, stale: "unknown", decision: "Injected",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := collectPod(t, tc.manifest, tc.pod, tc.objs...)
			if err != nil {
				t.Fatal(err)
			}
			if r.Delivery != tc.delivery || !strings.HasPrefix(r.StaleDriver, tc.stale) {
				t.Errorf("delivery %q, stale %q; want %q, %q", r.Delivery, r.StaleDriver, tc.delivery, tc.stale)
			}
			if r.NodeLayout != nil && r.NodeLayout.StillHas != tc.stillHas {
				t.Errorf("node still has the pod's layout: %v, want %v (%s)", r.NodeLayout.StillHas, tc.stillHas, r.NodeLayout.Note)
			}
			switch {
			case tc.decision == "" && r.Admission != nil:
				t.Errorf("decided again a pod that is neither pending nor refused: %+v", r.Admission)
			case tc.decision != "" && (r.Admission == nil || r.Admission.Decision != tc.decision):
				t.Errorf("admission now %+v, want %s", r.Admission, tc.decision)
			}
			all := strings.Join(r.Attention, "\n")
			if len(tc.attention) == 0 && all != "" {
				t.Errorf("attention:\n%s\nwant none", all)
			}
			for _, want := range tc.attention {
				if !strings.Contains(all, want) {
					t.Errorf("attention:\n%s\nwant %q", all, want)
				}
			}
			var out bytes.Buffer
			if err := Write(&out, r, "table"); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), "POD") || !strings.Contains(out.String(), "STALE DRIVER") {
				t.Errorf("table:\n%s", out.String())
			}
			if tc.decision == "Denied" && !regexp.MustCompile(`WEBHOOK NOW +Denied: gpu-injector: no ready GPU node layout fits this pod`).MatchString(out.String()) {
				t.Errorf("the table does not say the webhook's reason:\n%s", out.String())
			}
		})
	}
}

func withStatus(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: "Unschedulable", Message: "0/2 nodes are available"}}}
	return p
}

func TestStatusPodNotFound(t *testing.T) {
	_, err := collectPod(t, nil, "gone")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "-f") {
		t.Errorf("error %v, want ErrNotFound that says how to pass a manifest", err)
	}
}

func TestAsSubmittedUndoesTheInjection(t *testing.T) {
	pod := injected("train", "gpu-1", plan)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "data"})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
	pod.Annotations[layout.AnnotationImagesUnread] = `{"images":[{"image":"a","reason":"b"}]}`
	pod.Labels = map[string]string{layout.LabelImagesUnread: layout.LabelImagesUnreadValue, "app": "train"}
	rec, err := layout.ParseInjected(pod.Annotations[layout.AnnotationInjected])
	if err != nil {
		t.Fatal(err)
	}
	p := asSubmitted(pod, &rec)
	_, unread := p.Annotations[layout.AnnotationImagesUnread]
	if _, ok := p.Annotations[layout.AnnotationInjected]; ok || unread || len(p.Labels) != 1 || len(p.Spec.NodeSelector) != 0 || p.Spec.NodeName != "" ||
		len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].Name != "data" || len(p.Spec.Containers[0].VolumeMounts) != 1 {
		t.Errorf("as submitted: %+v", p)
	}
	if pod.Spec.NodeName != "gpu-1" || len(pod.Spec.Volumes) != 2 {
		t.Error("the pod read was changed")
	}
}

// TestStatusPodImagesUnread: the record of images admitted unread is shown
// as the pod says; one that does not decode is said, not shown, and
// neither needs attention.
func TestStatusPodImagesUnread(t *testing.T) {
	for name, tc := range map[string]struct {
		record string
		want   []string
		note   bool
	}{
		"recorded": {record: layout.NewImagesUnread([]layout.ImageUnread{{Image: "registry.example:5000/team/app:v2", Reason: "dial tcp 10.0.0.9:5000: connect: connection refused"}}).String(),
			want: []string{"IMAGES UNREAD", "registry.example:5000/team/app:v2: dial tcp 10.0.0.9:5000: connect: connection refused", "recreate it once the registry answers"}},
		"forged": {record: `{"images":[{"image":"x","reason":"\u001b[2J"}]}`, note: true,
			want: []string{"IMAGES UNREAD", "record ignored: failed to decode gpu-injector.io/images-unread"}},
	} {
		t.Run(name, func(t *testing.T) {
			pod := injected("train", "gpu-1", plan)
			pod.Annotations[layout.AnnotationImagesUnread] = tc.record
			r, err := collectPod(t, nil, "train", pod, gpuNode(t, "gpu-1", plan, nil))
			if err != nil {
				t.Fatal(err)
			}
			if (r.ImagesUnreadNote != "") != tc.note || (len(r.ImagesUnread) == 0) != tc.note || len(r.Attention) != 0 {
				t.Errorf("images unread %+v, note %q, attention %v", r.ImagesUnread, r.ImagesUnreadNote, r.Attention)
			}
			var out bytes.Buffer
			if err := render(&out, r); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "\x1b") {
				t.Errorf("a control character reached the output:\n%s", out.String())
			}
		})
	}
}
