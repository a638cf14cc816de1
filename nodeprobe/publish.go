package nodeprobe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/layout"
)

// Keys the probe publishes besides the layout contract's: where the version
// came from, and NVML's state when it could not be used.
const (
	AnnotationVersionSource = layout.Prefix + "driver-version-source"
	AnnotationNVMLState     = layout.Prefix + "nvml-state"
	// FieldManager names the probe in the Node's managed fields.
	FieldManager = "gpu-injector-nodeprobe"
)

// NodeConditionDriverWedged is the Node condition the probe sets True while
// its node's driver is wedged (the state label is wedged), and False once
// NVML answers again. It is the one Node status field the probe writes: where
// people and node remediation tools (Cluster API's MachineHealthCheck,
// node-problem-detector's consumers) look for a node that needs a reboot.
const NodeConditionDriverWedged corev1.NodeConditionType = "GPUDriverWedged"

// Reasons of NodeConditionDriverWedged when False. When True, the reason is
// the probe's condition (DriverWedged or GPULost).
const (
	// ReasonDriverAnswers: the last probe's NVML calls returned in time and
	// reported no lost GPU.
	ReasonDriverAnswers = "DriverAnswers"
	// ReasonNVMLUnavailable: the last probe could not use NVML at all (no
	// library, or one the probe refuses to call), so nothing says the driver
	// is wedged.
	ReasonNVMLUnavailable = "NVMLUnavailable"
)

// Published is what the probe puts on its Node: only keys in owned, and
// the GPUDriverWedged condition.
type Published struct {
	Labels      map[string]string
	Annotations map[string]string
	// Wedged is NodeConditionDriverWedged as the result has it. It is
	// written when it is True or when the Node has the condition already: a
	// node that was never wedged never gets it.
	Wedged WedgedCondition
}

// WedgedCondition is what the probe sets of NodeConditionDriverWedged.
type WedgedCondition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// withLabel returns p with label k set to v, on a copy of p's labels: a
// publication is shared with the next republish.
func (p Published) withLabel(k, v string) Published {
	if p.Labels[k] == v {
		return p
	}
	labels := make(map[string]string, len(p.Labels)+1)
	for key, val := range p.Labels {
		labels[key] = val
	}
	labels[k] = v
	p.Labels = labels
	return p
}

// Desired returns the labels and annotations a result publishes.
func Desired(r Result) (Published, error) {
	p := Published{Labels: map[string]string{}, Annotations: map[string]string{}}
	setLabel := func(k, v string) {
		if v = labelValue(v); v != "" {
			p.Labels[k] = v
		}
	}
	if r.Ready() {
		enc, err := layout.Encode(*r.Plan)
		if err != nil {
			return p, err
		}
		p.Labels[layout.LabelState] = layout.StateReady
		p.Labels[layout.LabelFingerprint] = r.Plan.Fingerprint()
		p.Annotations[layout.AnnotationLayout] = enc
	} else if r.Condition == ConditionNoDriver {
		// Not a failure: a node without a GPU, where the probe idles.
		p.Labels[layout.LabelState] = layout.StateNoDriver
		p.Annotations[layout.AnnotationStateReason] = r.Reason()
	} else if r.Wedged() {
		// Apart from error: the driver is there and would come back after a
		// reboot, and the webhook tells a pod's owner that this is why.
		p.Labels[layout.LabelState] = layout.StateWedged
		p.Annotations[layout.AnnotationStateReason] = r.Reason()
	} else {
		p.Labels[layout.LabelState] = layout.StateError
		p.Annotations[layout.AnnotationStateReason] = r.Reason()
	}
	switch {
	case r.Wedged():
		p.Wedged = WedgedCondition{Status: corev1.ConditionTrue, Reason: string(r.Condition), Message: r.Message}
	case r.NVML.State == "" || r.NVML.State == NVMLLibraryNotFound || r.NVML.State == NVMLLibraryInvalid:
		p.Wedged = WedgedCondition{Status: corev1.ConditionFalse, Reason: ReasonNVMLUnavailable,
			Message: "the probe cannot use NVML here, so nothing says the driver is wedged"}
	default:
		p.Wedged = WedgedCondition{Status: corev1.ConditionFalse, Reason: ReasonDriverAnswers, Message: "NVML answered the probe in time and reports no GPU lost"}
	}
	setLabel(layout.LabelDriverVersion, r.DriverVersion)
	if r.VersionSource != "" {
		p.Annotations[AnnotationVersionSource] = string(r.VersionSource)
	}
	if r.NVML.State != "" && r.NVML.State != NVMLOK {
		p.Annotations[AnnotationNVMLState] = string(r.NVML.State) + ": " + r.NVML.Message
	}
	if f := r.NVML.Facts; f != nil {
		setLabel(layout.LabelCUDADriverVersion, f.CUDADriverVersion)
		if n, ok := layout.CUDAVersionNumber(f.CUDADriverVersion); ok {
			p.Labels[layout.LabelCUDADriverVersionNumber] = strconv.Itoa(n)
		}
		if len(f.GPUs) > 0 {
			p.Labels[layout.LabelGPUCount] = strconv.Itoa(len(f.GPUs))
			// A mixed node advertises what every GPU offers at least.
			product, mem, cc, mig := f.GPUs[0].Product, f.GPUs[0].MemoryMiB, f.GPUs[0].ComputeCapability, false
			for _, g := range f.GPUs {
				if g.Product != product {
					product = "mixed"
				}
				mem = min(mem, g.MemoryMiB)
				if layout.CompareVersions(g.ComputeCapability, cc) < 0 {
					cc = g.ComputeCapability
				}
				mig = mig || g.MIGEnabled
			}
			setLabel(layout.LabelGPUProduct, product)
			p.Labels[layout.LabelGPUMemoryMiB] = strconv.FormatUint(mem, 10)
			setLabel(layout.LabelComputeCapability, cc)
			p.Labels[layout.LabelMIGEnabled] = strconv.FormatBool(mig)
		}
	}
	return p, nil
}

// labelValue makes s a valid label value: runs of other characters become
// '-', ends are trimmed to alphanumerics, length to 63. "" if nothing is left.
func labelValue(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok || c == '-' {
			if !dash {
				b.WriteByte('-')
			}
			dash = true
			continue
		}
		dash = false
		b.WriteRune(c)
	}
	v := b.String()
	if len(v) > validation.LabelValueMaxLength {
		v = v[:validation.LabelValueMaxLength]
	}
	v = strings.TrimFunc(v, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	})
	if len(validation.IsValidLabelValue(v)) > 0 {
		return ""
	}
	return v
}

// owned are the keys this probe publishes, and so the only keys it removes.
// Other keys under layout.Prefix belong to people (a label that a static
// layout's nodeSelector uses, a test's marker) and must survive every write.
var owned = map[string]bool{
	layout.AnnotationLayout: true, layout.LabelFingerprint: true, layout.LabelState: true,
	layout.AnnotationStateReason: true, layout.LabelDriverVersion: true, layout.LabelCUDADriverVersion: true,
	layout.LabelGPUProduct: true, layout.LabelGPUCount: true, layout.LabelGPUMemoryMiB: true,
	layout.LabelComputeCapability: true, layout.LabelMIGEnabled: true,
	AnnotationVersionSource: true, AnnotationNVMLState: true,
	layout.LabelNRIPlugin: true, layout.LabelCUDADriverVersionNumber: true,
	layout.AnnotationStaleDriver: true, layout.LabelDriverMounts: true,
}

// ours returns the entries of m that the probe owns.
func ours(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if owned[k] {
			out[k] = v
		}
	}
	return out
}

// mergePatch sets what changed and nulls our keys that are no longer wanted;
// current holds only owned keys, so no other key is ever named.
func mergePatch(current, desired map[string]string) map[string]any {
	patch := map[string]any{}
	for k, v := range desired {
		if cv, ok := current[k]; !ok || cv != v {
			patch[k] = v
		}
	}
	for k := range current {
		if _, ok := desired[k]; !ok {
			patch[k] = nil
		}
	}
	return patch
}

// Publish writes p on the node, only if our keys differ from it. It reports
// whether it wrote.
func Publish(ctx context.Context, c kubernetes.Interface, nodeName string, p Published) (bool, error) {
	node, err := c.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("failed to get node %q: %w", nodeName, err)
	}
	return publishOn(ctx, c, node, p)
}

func publishOn(ctx context.Context, c kubernetes.Interface, node *corev1.Node, p Published) (bool, error) {
	// The labels first: they are what keeps the webhook from sending pods
	// to a wedged node, so a refused condition must not hold them back.
	wrote, err := publishKeys(ctx, c, node, p)
	if err != nil {
		return wrote, err
	}
	cond, err := publishCondition(ctx, c, node, p.Wedged)
	return wrote || cond, err
}

func publishKeys(ctx context.Context, c kubernetes.Interface, node *corev1.Node, p Published) (bool, error) {
	curL, curA := ours(node.Labels), ours(node.Annotations)
	if apiequality.Semantic.DeepEqual(curL, p.Labels) && apiequality.Semantic.DeepEqual(curA, p.Annotations) {
		return false, nil
	}
	meta := map[string]any{}
	if l := mergePatch(curL, p.Labels); len(l) > 0 {
		meta["labels"] = l
	}
	if a := mergePatch(curA, p.Annotations); len(a) > 0 {
		meta["annotations"] = a
	}
	data, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return false, fmt.Errorf("failed to encode node patch: %w", err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
		return false, fmt.Errorf("failed to patch node %q: %w", node.Name, err)
	}
	return true, nil
}

// publishCondition sets NodeConditionDriverWedged through the status
// subresource when it differs from want; a node without the condition gets
// it only when it is True. The patch is a strategic merge on the conditions'
// type, so the kubelet's conditions are never named.
func publishCondition(ctx context.Context, c kubernetes.Interface, node *corev1.Node, want WedgedCondition) (bool, error) {
	var cur *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == NodeConditionDriverWedged {
			cur = &node.Status.Conditions[i]
		}
	}
	if want.Status == "" || (cur == nil && want.Status != corev1.ConditionTrue) ||
		(cur != nil && cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message) {
		return false, nil
	}
	now := metav1.Now()
	cond := corev1.NodeCondition{Type: NodeConditionDriverWedged, Status: want.Status, Reason: want.Reason, Message: want.Message,
		LastHeartbeatTime: now, LastTransitionTime: now}
	if cur != nil && cur.Status == want.Status {
		cond.LastTransitionTime = cur.LastTransitionTime
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return false, fmt.Errorf("failed to encode node status patch: %w", err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status"); err != nil {
		if apierrors.IsForbidden(err) {
			err = fmt.Errorf("%w: %w", ErrConditionForbidden, err)
		}
		return false, fmt.Errorf("failed to set condition %s of node %q: %w", NodeConditionDriverWedged, node.Name, err)
	}
	return true, nil
}

// ErrConditionForbidden is a refused GPUDriverWedged condition: the chart
// grants Node status only where its admission policy narrows it
// (nodeRestriction on). The state label, written first, still marks
// the node, which is what keeps GPU pods away.
var ErrConditionForbidden = errors.New("the probe may not write Node status")

// NodeObject is the Node that --once prints: only our labels and
// annotations, and the GPUDriverWedged condition when it is True.
type NodeObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   NodeMeta          `json:"metadata"`
	Status     *NodeObjectStatus `json:"status,omitempty"`
}

// NodeObjectStatus is the printed part of the Node's status.
type NodeObjectStatus struct {
	Conditions []NodeObjectCondition `json:"conditions"`
}

// NodeObjectCondition is a printed Node condition, without its times.
type NodeObjectCondition struct {
	Type    corev1.NodeConditionType `json:"type"`
	Status  corev1.ConditionStatus   `json:"status"`
	Reason  string                   `json:"reason,omitempty"`
	Message string                   `json:"message,omitempty"`
}

// NodeMeta is the printed part of the Node's metadata.
type NodeMeta struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}
