// Package cleanup removes what gpu-injector wrote to a cluster besides the
// objects its chart installs: the probes' labels, annotations and
// GPUDriverWedged condition on every Node, and the webhook's memory of pools
// (a ConfigMap and its leader election Lease), and the helm test's pods. The chart's pre-delete hook
// runs it (`gpu-injector cleanup`), so that helm uninstall leaves the
// cluster as it found it.
//
// The writers go first: with the webhook configuration, the webhook and the
// probes still running, a probe would publish its layout again, or the
// webhook remember a pool, after the keys were removed.
package cleanup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-injector/gpu-injector/layout"
)

// ConditionDriverWedged is the one Node condition the probe sets
// (nodeprobe.NodeConditionDriverWedged; a test keeps the two equal).
const ConditionDriverWedged corev1.NodeConditionType = "GPUDriverWedged"

// Options name the release's objects. An empty name skips that step.
type Options struct {
	Client kubernetes.Interface
	// Namespace is the release namespace.
	Namespace string
	// WebhookConfiguration is the MutatingWebhookConfiguration, deleted first
	// so that no pod creation waits on a webhook that is going away.
	WebhookConfiguration string
	// WebhookDeployment and ProbeDaemonSet are deleted, and waited for until
	// their pods are gone.
	WebhookDeployment string
	ProbeDaemonSet    string
	// PoolMemory names the ConfigMap and the Lease of the remembered pools.
	PoolMemory string
	// Pods in Namespace are deleted: the helm test's, which helm keeps for
	// its logs.
	Pods []string
	// Timeout bounds the wait for the writers' pods; 2 minutes when zero.
	Timeout time.Duration
	// Poll is how often the wait looks; 1 s when zero.
	Poll time.Duration
	Log  logr.Logger
}

// Run removes everything Options name, then gpu-injector's keys from every
// Node. It goes on past a failed step and returns every error.
func Run(ctx context.Context, o Options) error {
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	var errs []error
	if err := stopWriters(ctx, o); err != nil {
		// A writer still running may write again: the Nodes are cleaned all
		// the same, and the error fails the hook, so that helm says so.
		errs = append(errs, err)
	}
	if err := CleanNodes(ctx, o.Client, o.Log); err != nil {
		errs = append(errs, err)
	}
	if err := deleteOwn(ctx, o); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func stopWriters(ctx context.Context, o Options) error {
	c := o.Client
	foreground := metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationForeground)}
	var errs []error
	if o.WebhookConfiguration != "" {
		err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, o.WebhookConfiguration, metav1.DeleteOptions{})
		errs = append(errs, logDelete(o.Log, err, "MutatingWebhookConfiguration", o.WebhookConfiguration))
	}
	type gone func(context.Context) error
	var waits []gone
	if o.WebhookDeployment != "" {
		d := c.AppsV1().Deployments(o.Namespace)
		err := d.Delete(ctx, o.WebhookDeployment, foreground)
		errs = append(errs, logDelete(o.Log, err, "Deployment", o.WebhookDeployment))
		waits = append(waits, func(ctx context.Context) error {
			_, err := d.Get(ctx, o.WebhookDeployment, metav1.GetOptions{})
			return err
		})
	}
	if o.ProbeDaemonSet != "" {
		d := c.AppsV1().DaemonSets(o.Namespace)
		err := d.Delete(ctx, o.ProbeDaemonSet, foreground)
		errs = append(errs, logDelete(o.Log, err, "DaemonSet", o.ProbeDaemonSet))
		waits = append(waits, func(ctx context.Context) error {
			_, err := d.Get(ctx, o.ProbeDaemonSet, metav1.GetOptions{})
			return err
		})
	}
	// Foreground deletion keeps the owner until the garbage collector has
	// deleted its pods: once Get says NotFound, no replica or probe runs.
	for _, w := range waits {
		err := wait.PollUntilContextTimeout(ctx, o.Poll, o.Timeout, true, func(ctx context.Context) (bool, error) {
			err := w(ctx)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to wait for the webhook's and the probes' pods to stop: %w", err))
		}
	}
	return errors.Join(errs...)
}

func deleteOwn(ctx context.Context, o Options) error {
	c := o.Client
	var errs []error
	if o.PoolMemory != "" {
		err := c.CoreV1().ConfigMaps(o.Namespace).Delete(ctx, o.PoolMemory, metav1.DeleteOptions{})
		errs = append(errs, logDelete(o.Log, err, "ConfigMap", o.PoolMemory))
		err = c.CoordinationV1().Leases(o.Namespace).Delete(ctx, o.PoolMemory, metav1.DeleteOptions{})
		errs = append(errs, logDelete(o.Log, err, "Lease", o.PoolMemory))
	}
	for _, name := range o.Pods {
		err := c.CoreV1().Pods(o.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		errs = append(errs, logDelete(o.Log, err, "Pod", name))
	}
	return errors.Join(errs...)
}

// logDelete: deleted, or already gone, is success.
func logDelete(log logr.Logger, err error, kind, name string) error {
	switch {
	case err == nil:
		log.Info("deleted", "kind", kind, "name", name)
		return nil
	case apierrors.IsNotFound(err):
		return nil
	}
	return fmt.Errorf("failed to delete %s %s: %w", kind, name, err)
}

// CleanNodes removes every label and annotation under gpu-injector.io/ and
// the GPUDriverWedged condition from every Node.
func CleanNodes(ctx context.Context, c kubernetes.Interface, log logr.Logger) error {
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("failed to list nodes: %w", err)
	}
	var errs []error
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if err := cleanNode(ctx, c, n, log); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func cleanNode(ctx context.Context, c kubernetes.Interface, n *corev1.Node, log logr.Logger) error {
	patch, removed := MetadataPatch(n)
	if patch != nil {
		if _, err := c.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("failed to remove gpu-injector's keys from node %s: %w", n.Name, err)
		}
		log.Info("removed node keys", "node", n.Name, "keys", removed)
	}
	patch, err := ConditionPatch(n)
	if err != nil || patch == nil {
		return err
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("failed to remove condition %s from node %s: %w", ConditionDriverWedged, n.Name, err)
	}
	log.Info("removed node condition", "node", n.Name, "condition", ConditionDriverWedged)
	return nil
}

// MetadataPatch is the merge patch that removes gpu-injector's labels and
// annotations from n (nil when it has none), and the keys it removes.
func MetadataPatch(n *corev1.Node) ([]byte, []string) {
	labels, annotations := map[string]any{}, map[string]any{}
	var removed []string
	for k := range n.Labels {
		if strings.HasPrefix(k, layout.Prefix) {
			labels[k] = nil
			removed = append(removed, k)
		}
	}
	for k := range n.Annotations {
		if strings.HasPrefix(k, layout.Prefix) {
			annotations[k] = nil
			removed = append(removed, k)
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	sort.Strings(removed)
	meta := map[string]any{}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	// Marshalling maps of strings cannot fail.
	b, _ := json.Marshal(map[string]any{"metadata": meta})
	return b, removed
}

// ConditionPatch is the JSON patch that removes the GPUDriverWedged
// condition from n's status (nil when it has none). Each removal is guarded
// by a test of the condition's type at that index, so that a kubelet
// rewriting the conditions meanwhile makes the patch fail rather than
// remove one of its own.
func ConditionPatch(n *corev1.Node) ([]byte, error) {
	var ops []map[string]any
	// From the last, so that earlier indices stay valid.
	for i := len(n.Status.Conditions) - 1; i >= 0; i-- {
		if n.Status.Conditions[i].Type != ConditionDriverWedged {
			continue
		}
		path := fmt.Sprintf("/status/conditions/%d", i)
		ops = append(ops,
			map[string]any{"op": "test", "path": path + "/type", "value": string(ConditionDriverWedged)},
			map[string]any{"op": "remove", "path": path})
	}
	if len(ops) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the condition patch: %w", err)
	}
	return b, nil
}
