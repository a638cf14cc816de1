package nodeprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
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

// Published is what the probe puts on its Node: only keys in owned.
type Published struct {
	Labels      map[string]string
	Annotations map[string]string
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
	} else {
		p.Labels[layout.LabelState] = layout.StateError
		p.Annotations[layout.AnnotationStateReason] = r.Reason()
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
		if len(f.GPUs) > 0 {
			p.Labels[layout.LabelGPUCount] = strconv.Itoa(len(f.GPUs))
			// A mixed node advertises what every GPU offers at least.
			product, mem, cc, mig := f.GPUs[0].Product, f.GPUs[0].MemoryMiB, f.GPUs[0].ComputeCapability, false
			for _, g := range f.GPUs {
				if g.Product != product {
					product = "mixed"
				}
				mem = min(mem, g.MemoryMiB)
				if versionLess(g.ComputeCapability, cc) {
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

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
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

// NodeObject is the Node that --once prints: only our labels and annotations.
type NodeObject struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Metadata   NodeMeta `json:"metadata"`
}

// NodeMeta is the printed part of the Node's metadata.
type NodeMeta struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}
