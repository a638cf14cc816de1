package gpunodes

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/webhook/inject"
)

// PolicySwitch turns the chart's MutatingAdmissionPolicy on and off under
// driverDelivery PreferRuntime. The policy's binding names a ConfigMap as its
// parameter, with parameterNotFoundAction Allow: while the ConfigMap exists
// the API server admits the pods the policy takes itself, and while it does
// not the policy does nothing and the webhook is called for every GPU pod.
// The switch keeps the ConfigMap while inject.PolicyServes holds for the
// index: the policy is on only while it answers as the webhook would.
//
// Absent is the safe state: a webhook that never starts, a replica that is
// not elected, an index not yet listed or an API error leave every pod to the
// webhook, which decides from the nodes it sees. Only a switch left on while
// the webhook is gone outlives what it knew.
type PolicySwitch struct {
	cfg       *config.Configuration
	idx       *Index
	reader    client.Reader
	writer    client.Writer
	namespace string
	name      string
	log       logr.Logger
	// Interval is how often the index is read: a layout that needs hostPath
	// turns the policy off within it, plus the API server's watch of the
	// ConfigMap.
	Interval time.Duration
	// Resync is how often the ConfigMap is read back, so that one deleted or
	// created by hand is put right.
	Resync time.Duration
	// Clock paces both; the real clock unless set.
	Clock clock.WithTicker
	// Off keeps the ConfigMap absent, whatever the nodes: the chart renders
	// no switched policy, and a ConfigMap left by an earlier release would
	// turn a later release's policy on before its switch had read a node.
	Off bool
}

// NewPolicySwitch returns the switch of ConfigMap namespace/name. The reader
// should be the API server's, not a cache's: the switch's only read is the
// one object, rarely.
func NewPolicySwitch(cfg *config.Configuration, idx *Index, r client.Reader, w client.Writer, namespace, name string, log logr.Logger) *PolicySwitch {
	return &PolicySwitch{cfg: cfg, idx: idx, reader: r, writer: w, namespace: namespace, name: name, log: log, Interval: time.Second, Resync: time.Minute, Clock: wallclock.Real()}
}

// NeedLeaderElection: one writer, so that replicas whose indexes differ for a
// moment do not flip the switch back and forth. A switch kept off only
// deletes, which every replica may do.
func (s *PolicySwitch) NeedLeaderElection() bool { return !s.Off }

// Start keeps the switch until ctx ends. The index is read every Interval
// (an atomic load while nothing changed); the API server only when the
// answer changes, and every Resync.
func (s *PolicySwitch) Start(ctx context.Context) error {
	s.log.Info("switching the admission policy", "configMap", s.namespace+"/"+s.name, "interval", s.Interval.String(), "keptOff", s.Off)
	t := s.Clock.NewTicker(s.Interval)
	defer t.Stop()
	var applied *bool
	var snapshot []*inject.Layout
	var wedgedSnap []*inject.WedgedNode
	lastRead := time.Time{}
	for {
		if s.Off || s.idx.Ready() {
			layouts, wedged := s.idx.Layouts(), s.idx.Wedged()
			stale := applied == nil || s.Clock.Since(lastRead) >= s.Resync
			if stale || !sameSnapshot(layouts, snapshot) || !sameSnapshot(wedged, wedgedSnap) {
				on := !s.Off && inject.PolicyServes(s.cfg, layouts, wedged)
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

// Set creates the ConfigMap (on) or deletes it (off), if it is not so yet.
func (s *PolicySwitch) Set(ctx context.Context, on bool) error {
	key := types.NamespacedName{Namespace: s.namespace, Name: s.name}
	err := s.reader.Get(ctx, key, &corev1.ConfigMap{})
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("failed to read configmap %s: %w", key, err)
	case on == (err == nil):
		return nil
	case on:
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: s.name,
			Labels:      map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "webhook"},
			Annotations: map[string]string{layout.Prefix + "about": "present while every known GPU node delivers the driver at the runtime: the admission policy then admits modern GPU pods without a webhook call; written by the webhook"}}}
		if err := s.writer.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("failed to create configmap %s: %w", key, err)
		}
	default:
		if err := s.writer.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: s.name}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("failed to delete configmap %s: %w", key, err)
		}
	}
	s.log.Info("switched the admission policy", "configMap", key.String(), "on", on)
	return nil
}
