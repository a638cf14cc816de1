package precheck

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// webhook tries the dry-run GPU pod as `gpu-injector status` does: in
// DryRunNamespace (again while it has no default ServiceAccount yet), else
// in an opted-in namespace, one the checks found no refusal in first. An
// error means ctx ended.
func (c *Collector) webhook(ctx context.Context, sc *status.Collector, namespaces []NamespaceCheck) (WebhookCheck, error) {
	var d status.DryRunLog
	if c.DryRunNamespace != "" {
		var err error
		if d, err = sc.TryPodIn(ctx, c.DryRunNamespace); err != nil {
			return WebhookCheck{}, err
		}
	} else {
		candidates := make([]status.NamespaceStatus, 0, len(namespaces))
		for _, ns := range namespaces {
			s := status.NamespaceStatus{Name: ns.Name, Enforce: ns.Enforce, Excluded: ns.Excluded}
			if len(ns.Refused) > 0 {
				s.Refused = ns.Message
			}
			candidates = append(candidates, s)
		}
		d = sc.TryPod(ctx, candidates)
	}
	if d.Outcome != status.DryRunInjected || !d.Policy {
		return webhookCheck(d), nil
	}
	// The chart's admission policy answered, in the API server itself: a pod
	// with the legacy limit, which only the webhook renames, asks the webhook.
	legacy, err := sc.TryPodOf(ctx, d.Namespace, legacyPod())
	if err != nil {
		return WebhookCheck{}, err
	}
	w := webhookCheck(legacy)
	w.Message = layout.OneLine("the chart's MutatingAdmissionPolicy marked the dry-run GPU pod in "+d.Namespace+
		" for gpu-injector's NRI plugin, without the webhook; the same pod with the legacy "+legacyResource+
		" limit, which only the webhook takes: "+w.Message, 1000)
	return w, nil
}

// legacyResource is the GPU name of Kubernetes before 1.10, which the
// webhook rewrites and the admission policy never takes.
const legacyResource = "alpha.kubernetes.io/nvidia-gpu"

func legacyPod() *corev1.Pod {
	p := status.DryRunPod()
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{legacyResource: resource.MustParse("1")}
	return p
}

// webhookCheck reads the API server's answer: the webhook was reached when
// the pod came back with gpu-injector's record or marker, or with a warning
// it wrote.
func webhookCheck(d status.DryRunLog) WebhookCheck {
	w := WebhookCheck{Outcome: WebhookFailed, DryRun: &d}
	in := "a dry-run GPU pod in " + d.Namespace
	switch d.Outcome {
	case status.DryRunInjected:
		w.Outcome, w.Message = WebhookOK, in+" came back injected: "+injectedAs(d)
	case status.DryRunUnchanged:
		if warning := ownWarning(d.Warnings); warning != "" {
			w.Outcome, w.Message = WebhookOK, in+" came back with the webhook's warning: "+warning
		} else {
			w.Message = in + " was admitted without gpu-injector's change: the API server did not send it to the webhook (its namespaceSelector, objectSelector, matchConditions), or failurePolicy Ignore let it through an unreachable webhook"
		}
	case status.DryRunUnreachable:
		w.Message = "the API server CANNOT REACH the webhook: " + d.Message
	case status.DryRunDenied:
		w.Message = in + " was DENIED: " + d.Message
	case status.DryRunSkipped:
		w.Outcome, w.Message, w.DryRun = WebhookSkipped, "not tried: "+d.Message+"; label a namespace, or pass -dry-run-namespace", nil
	default:
		w.Message = in + " could not be created: " + d.Message
	}
	w.Message = layout.OneLine(w.Message, 1000)
	return w
}

func injectedAs(d status.DryRunLog) string {
	switch {
	case d.RuntimeInject != "" || d.Runtime == layout.InjectedByNRI:
		return "marked for gpu-injector's NRI plugin"
	case len(d.HostPaths) > 0:
		return fmt.Sprintf("layout %s (driver %s), hostPath %s", d.Fingerprint, d.DriverVersion, strings.Join(d.HostPaths, ", "))
	}
	return fmt.Sprintf("layout %s (driver %s)", d.Fingerprint, d.DriverVersion)
}

// ownWarning is the first admission warning gpu-injector wrote, "" if none.
func ownWarning(warnings []string) string {
	for _, w := range warnings {
		if strings.HasPrefix(w, inject.WarnPrefix) {
			return strings.TrimPrefix(w, inject.WarnPrefix)
		}
	}
	return ""
}
