package gpunodes

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// PolicySwitch turns the chart's MutatingAdmissionPolicy on and off under
// driverDelivery PreferRuntime through the policy's one binding. The chart
// renders the binding off: its matchResources select no namespace
// (PolicyOffSelector). While inject.PolicyServes holds for the index, the
// switch opens the selector and the API server admits the pods the policy
// takes itself; when a known GPU node needs hostPath volumes it closes it, and
// the webhook is called for every GPU pod again.
//
// The switch is the binding's own spec, not a parameter object: the API
// server stops watching a parameter kind once no binding names it and keeps
// the last objects it saw until it restarts (kubernetes/kubernetes#130887), so
// a parameter turned off after an upgrade could stay on. Bindings themselves
// are always watched.
//
// Closed is the safe state: a webhook that never starts, a replica that is
// not elected, an index not yet listed, an API error or a helm upgrade (which
// renders the binding closed again) leave every pod to the webhook, which
// decides from the nodes it sees. Only a switch left open while the webhook is
// gone outlives what it knew.
type PolicySwitch struct {
	cfg    *config.Configuration
	idx    *Index
	reader client.Reader
	writer client.Writer
	name   string
	log    logr.Logger
	// Interval is how often the index is read: a layout that needs hostPath
	// turns the policy off within it, plus the API server's watch of the
	// binding.
	Interval time.Duration
	// Resync is how often the binding is read back, so that one closed by an
	// upgrade or changed by hand is put right.
	Resync time.Duration
	// Clock paces both; the real clock unless set.
	Clock clock.WithTicker
}

// PolicyOffSelector is the namespaceSelector of a closed binding: no
// namespace lacks kubernetes.io/metadata.name, which the API server sets on
// every namespace. The chart renders it; an open binding selects every
// namespace and leaves the choice to the policy's matchConstraints.
func PolicyOffSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpDoesNotExist}}}
}

// NewPolicySwitch returns the switch of MutatingAdmissionPolicyBinding name.
// The reader should be the API server's, not a cache's: the switch's only
// read is the one object, rarely.
func NewPolicySwitch(cfg *config.Configuration, idx *Index, r client.Reader, w client.Writer, name string, log logr.Logger) *PolicySwitch {
	return &PolicySwitch{cfg: cfg, idx: idx, reader: r, writer: w, name: name, log: log, Interval: time.Second, Resync: time.Minute, Clock: wallclock.Real()}
}

// NeedLeaderElection: one writer, so that replicas whose indexes differ for a
// moment do not flip the switch back and forth.
func (s *PolicySwitch) NeedLeaderElection() bool { return true }

// Start keeps the switch until ctx ends. The index is read every Interval
// (an atomic load while nothing changed); the API server only when the
// answer changes, and every Resync.
func (s *PolicySwitch) Start(ctx context.Context) error {
	s.log.Info("switching the admission policy", "binding", s.name, "interval", s.Interval.String(), "resync", s.Resync.String())
	t := s.Clock.NewTicker(s.Interval)
	defer t.Stop()
	var applied *bool
	var snapshot []*inject.Layout
	var wedgedSnap []*inject.WedgedNode
	lastRead := time.Time{}
	for {
		if s.idx.Ready() {
			layouts, wedged := s.idx.Layouts(), s.idx.Wedged()
			stale := applied == nil || s.Clock.Since(lastRead) >= s.Resync
			if stale || !sameSnapshot(layouts, snapshot) || !sameSnapshot(wedged, wedgedSnap) {
				on := inject.PolicyServes(s.cfg, layouts, wedged)
				if stale || *applied != on {
					if err := s.Set(ctx, on); err != nil {
						s.log.Error(err, "failed to switch the admission policy", "on", on)
						applied = nil
					} else {
						applied, lastRead = &on, s.Clock.Now()
					}
				}
				snapshot, wedgedSnap = layouts, wedged
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// sameSnapshot: the index publishes a new slice on every change.
func sameSnapshot[T any](a, b []*T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// Set opens (on) or closes the binding's namespaceSelector, if it is not so
// yet. A binding that is not there, or a kind the API server does not serve,
// is nothing to switch: the chart renders none there.
func (s *PolicySwitch) Set(ctx context.Context, on bool) error {
	b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
	if err := s.reader.Get(ctx, types.NamespacedName{Name: s.name}, b); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			s.log.V(1).Info("no admission policy binding to switch", "binding", s.name)
			return nil
		}
		return fmt.Errorf("failed to read mutatingadmissionpolicybinding %s: %w", s.name, err)
	}
	if (on && PolicyBindingOpen(b)) || (!on && PolicyBindingClosed(b)) {
		return nil
	}
	// A merge patch of the selector alone: the API server fills in the rest
	// of matchResources, and the chart's other fields stay as rendered. An
	// open selector has no terms (null removes them).
	var terms []metav1.LabelSelectorRequirement
	if !on {
		terms = PolicyOffSelector().MatchExpressions
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"matchResources": map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": nil, "matchExpressions": terms}}}})
	if err != nil {
		return fmt.Errorf("failed to encode the switch of mutatingadmissionpolicybinding %s: %w", s.name, err)
	}
	if err := s.writer.Patch(ctx, b, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("failed to switch mutatingadmissionpolicybinding %s: %w", s.name, err)
	}
	s.log.Info("switched the admission policy", "binding", s.name, "on", on)
	return nil
}

// PolicyBindingClosed reports whether a binding is switched off as the chart
// renders it under PreferRuntime, for the switch to open. A selector someone
// else wrote is neither open nor closed, and Set replaces it.
func PolicyBindingClosed(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) bool {
	mr := b.Spec.MatchResources
	return mr != nil && equality.Semantic.DeepEqual(mr.NamespaceSelector, PolicyOffSelector())
}

// PolicyBindingOpen reports whether a binding is switched on: its selector
// leaves the choice to the policy's matchConstraints.
func PolicyBindingOpen(b *admissionregistrationv1.MutatingAdmissionPolicyBinding) bool {
	mr := b.Spec.MatchResources
	return mr == nil || mr.NamespaceSelector == nil || equality.Semantic.DeepEqual(*mr.NamespaceSelector, metav1.LabelSelector{})
}
