package gpunodes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

// NextMemory merges what the pools publish now into what is stored: a live
// pool's entry is rewritten when its layout, labels or taints changed or its
// lastSeen is older than refresh; an entry whose pool is gone stays until it
// expires. It reports whether anything changed.
func NextMemory(stored, live []pools.Memory, now time.Time, remember, refresh time.Duration) ([]pools.Memory, bool) {
	byPool := make(map[string]pools.Memory, len(stored))
	for _, m := range stored {
		byPool[m.Pool] = m
	}
	changed := false
	seen := map[string]bool{}
	var out []pools.Memory
	for _, m := range live {
		seen[m.Pool] = true
		if old, ok := byPool[m.Pool]; ok && sameMemory(old, m) && now.Sub(old.LastSeen) < refresh {
			out = append(out, old)
			continue
		}
		out = append(out, m)
		changed = true
	}
	for _, m := range stored {
		if seen[m.Pool] {
			continue
		}
		if now.Sub(m.LastSeen) >= remember {
			changed = true
			continue
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b pools.Memory) int { return strings.Compare(a.Pool, b.Pool) })
	if len(out) > pools.MaxMemory {
		// The most recently seen pools are the ones worth keeping.
		slices.SortStableFunc(out, func(a, b pools.Memory) int { return b.LastSeen.Compare(a.LastSeen) })
		out = out[:pools.MaxMemory]
		slices.SortFunc(out, func(a, b pools.Memory) int { return strings.Compare(a.Pool, b.Pool) })
		changed = true
	}
	return out, changed
}

func sameMemory(a, b pools.Memory) bool {
	return a.Plan.Fingerprint() == b.Plan.Fingerprint() && maps.Equal(a.NodeLabels, b.NodeLabels) &&
		slices.EqualFunc(a.Taints, b.Taints, func(x, y corev1.Taint) bool { return x.Key == y.Key && x.Value == y.Value && x.Effect == y.Effect })
}

// Memory keeps the index's remembered pools in step with the ConfigMap: every
// replica reads it (Watch), the elected one writes it (Writer).
type Memory struct {
	cfg       *config.Configuration
	idx       *Index
	client    client.Client
	namespace string
	name      string
	log       logr.Logger
	// Interval is how often the writer compares the pools with the memory.
	Interval time.Duration
	// Clock ages the stored pools; the real clock unless set.
	Clock clock.PassiveClock
}

// NewMemory returns the memory of ConfigMap namespace/name.
func NewMemory(cfg *config.Configuration, idx *Index, c client.Client, namespace, name string, log logr.Logger) *Memory {
	return &Memory{cfg: cfg, idx: idx, client: c, namespace: namespace, name: name, log: log, Interval: 30 * time.Second, Clock: wallclock.Real()}
}

// MemoryCacheByObject restricts the ConfigMap informer to the memory's one object,
// which the Role's resourceNames also allow.
func MemoryCacheByObject(namespace, name string) cache.ByObject {
	return cache.ByObject{
		Namespaces: map[string]cache.Config{namespace: {}},
		Field:      fields.OneTermEqualSelector("metadata.name", name),
	}
}

// Watch feeds the index from the ConfigMap informer on every replica.
func (m *Memory) Watch(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &corev1.ConfigMap{})
	if err != nil {
		return fmt.Errorf("failed to get the configmap informer: %w", err)
	}
	load := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Name != m.name {
			return
		}
		m.load(cm.Data)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    load,
		UpdateFunc: func(_, obj any) { load(obj) },
		DeleteFunc: func(any) { m.load(nil) },
	})
	if err != nil {
		return fmt.Errorf("failed to add the configmap event handler: %w", err)
	}
	return nil
}

func (m *Memory) load(data map[string]string) {
	mem, errs := pools.DecodeMemory(data, m.cfg.Pinning.NodeLabels, m.cfg.Rules(), m.Clock.Now())
	for _, err := range errs {
		layoutsRejected.WithLabelValues(RejectMemory).Inc()
		m.log.Info("ignoring a remembered pool layout", "configMap", m.namespace+"/"+m.name, "error", err.Error())
	}
	m.idx.SetMemory(mem)
}

// Start runs the writer until ctx ends; the manager starts it only on the
// elected replica.
func (m *Memory) Start(ctx context.Context) error {
	m.log.Info("writing remembered pool layouts", "configMap", m.namespace+"/"+m.name, "rememberFor", m.cfg.Pinning.Remember().String())
	t := time.NewTicker(m.Interval)
	defer t.Stop()
	for {
		if err := m.Sync(ctx); err != nil {
			m.log.Error(err, "failed to write the remembered pool layouts")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: one writer, so that replicas do not race.
func (m *Memory) NeedLeaderElection() bool { return true }

// refresh is how stale a live pool's lastSeen may get before it is
// rewritten: a tenth of the memory's span, between a minute and an hour, so
// a steady cluster writes the ConfigMap at most once an hour.
func (m *Memory) refresh() time.Duration {
	return min(max(m.cfg.Pinning.Remember()/10, time.Minute), time.Hour)
}

// Sync writes the memory once if it changed.
func (m *Memory) Sync(ctx context.Context) error {
	if !m.idx.Ready() {
		// A partial node list would look like pools at zero.
		return nil
	}
	now := m.Clock.Now()
	cm := &corev1.ConfigMap{}
	err := m.client.Get(ctx, types.NamespacedName{Namespace: m.namespace, Name: m.name}, cm)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to read configmap %s/%s: %w", m.namespace, m.name, err)
	}
	stored, errs := pools.DecodeMemory(cm.Data, m.cfg.Pinning.NodeLabels, m.cfg.Rules(), now)
	next, changed := NextMemory(stored, m.idx.LivePools(now), now, m.cfg.Pinning.Remember(), m.refresh())
	if !changed && len(errs) == 0 && len(cm.Data) == len(stored) {
		return nil
	}
	data, err := pools.EncodeMemory(next)
	if err != nil {
		return err
	}
	if exists && maps.Equal(data, cm.Data) {
		return nil
	}
	if !exists {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: m.namespace, Name: m.name,
			Labels:      map[string]string{"app.kubernetes.io/name": "gpu-injector", "app.kubernetes.io/component": "webhook"},
			Annotations: map[string]string{layout.Prefix + "about": "the last driver layout of each GPU pool, kept for pools scaled to zero; written by the webhook"}},
			Data: data}
		if err := m.client.Create(ctx, cm); err != nil {
			return fmt.Errorf("failed to create configmap %s/%s: %w", m.namespace, m.name, err)
		}
	} else {
		cm.Data = data
		if err := m.client.Update(ctx, cm); err != nil {
			return fmt.Errorf("failed to update configmap %s/%s: %w", m.namespace, m.name, err)
		}
	}
	m.log.Info("wrote remembered pool layouts", "pools", len(next))
	return nil
}
