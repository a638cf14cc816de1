package gpunodes

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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
	"k8s.io/apimachinery/pkg/util/validation"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// The remembered pool layouts live in one ConfigMap in the webhook's own
// namespace: a restart keeps them, every replica reads them, and one elected
// replica writes them. Its content is treated like a node's annotation: an
// entry that does not decode strictly or breaks a layout rule is ignored.
const (
	// memoryKeyPrefix starts the data key of each pool's entry; the rest is a
	// hash of the pool key, which may hold characters a data key may not.
	memoryKeyPrefix = "pool-"
	// MaxMemoryPools bounds what is read and written: far above any real
	// number of GPU pools, far below the ConfigMap's 1 MiB.
	MaxMemoryPools = 256
	maxMemoryEntry = layout.MaxAnnotationBytes + 16<<10
	maxNodeLabels  = 128
	maxPoolTaints  = 32
	// maxClockSkew is how far in the future a lastSeen may lie before the
	// entry counts as forged: a replica's clock may run a little ahead.
	maxClockSkew = time.Hour
)

// memoryEntry is the stored form of a PoolMemory.
type memoryEntry struct {
	Pool       map[string]string `json:"pool"`
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
	Taints     []corev1.Taint    `json:"taints,omitempty"`
	// Layout is the plan as a node publishes it, so that it is decoded and
	// checked by the same code.
	Layout   string      `json:"layout"`
	LastSeen metav1.Time `json:"lastSeen"`
}

// MemoryKey is the ConfigMap data key of a pool.
func MemoryKey(pool string) string {
	sum := sha256.Sum256([]byte(pool))
	return memoryKeyPrefix + hex.EncodeToString(sum[:10])
}

// EncodeMemory renders pool memories as ConfigMap data.
func EncodeMemory(mem []PoolMemory) (map[string]string, error) {
	data := make(map[string]string, len(mem))
	for _, m := range mem {
		plan, err := layout.Encode(m.Plan)
		if err != nil {
			return nil, err
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(memoryEntry{Pool: m.Labels, NodeLabels: m.NodeLabels, Taints: m.Taints, Layout: plan, LastSeen: metav1.NewTime(m.LastSeen.UTC().Truncate(time.Second))}); err != nil {
			return nil, fmt.Errorf("failed to encode the memory of pool %s: %w", m.Pool, err)
		}
		data[MemoryKey(m.Pool)] = strings.TrimSpace(b.String())
	}
	return data, nil
}

// DecodeMemory reads ConfigMap data as pool memories for cfg, checking each
// entry as strictly as a node's layout. Entries of other pinning labels (the
// configuration changed) are skipped silently; broken ones are skipped and
// returned as errors, to be logged and counted.
func DecodeMemory(data map[string]string, cfg *config.Configuration, now time.Time) ([]PoolMemory, []error) {
	var out []PoolMemory
	var errs []error
	keys := slices.Sorted(maps.Keys(data))
	if len(keys) > MaxMemoryPools {
		errs = append(errs, fmt.Errorf("the memory holds %d entries, more than %d: the rest is ignored", len(keys), MaxMemoryPools))
		keys = keys[:MaxMemoryPools]
	}
	rules := cfg.Rules()
	for _, k := range keys {
		m, skip, err := decodeEntry(k, data[k], cfg, rules, now)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("entry %s: %w", k, err))
		case !skip:
			out = append(out, m)
		}
	}
	return out, errs
}

func decodeEntry(key, value string, cfg *config.Configuration, rules layout.Rules, now time.Time) (PoolMemory, bool, error) {
	var m PoolMemory
	if !strings.HasPrefix(key, memoryKeyPrefix) {
		return m, false, errors.New("not a pool entry")
	}
	if len(value) > maxMemoryEntry {
		return m, false, fmt.Errorf("%d bytes exceeds the limit of %d", len(value), maxMemoryEntry)
	}
	var e memoryEntry
	if err := layout.UnmarshalStrict([]byte(value), &e); err != nil {
		return m, false, fmt.Errorf("failed to decode: %w", err)
	}
	if len(e.Pool) != len(cfg.Pinning.NodeLabels) || PoolKey(e.Pool, cfg.Pinning.NodeLabels) == "" {
		// Written under other pinning labels: not an error, just not ours now.
		return m, true, nil
	}
	m.Pool = PoolKey(e.Pool, cfg.Pinning.NodeLabels)
	if key != MemoryKey(m.Pool) {
		return m, false, fmt.Errorf("data key does not match pool %q", m.Pool)
	}
	if len(e.NodeLabels) > maxNodeLabels {
		return m, false, fmt.Errorf("%d node labels exceed the limit of %d", len(e.NodeLabels), maxNodeLabels)
	}
	for k, v := range e.NodeLabels {
		if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
			return m, false, fmt.Errorf("node label %q: %s", layout.Truncate(k, 64), strings.Join(msgs, "; "))
		}
	}
	for k, v := range e.Pool {
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return m, false, fmt.Errorf("pool label %s: %s", k, strings.Join(msgs, "; "))
		}
	}
	if len(e.Taints) > maxPoolTaints {
		return m, false, fmt.Errorf("%d taints exceed the limit of %d", len(e.Taints), maxPoolTaints)
	}
	for _, t := range e.Taints {
		if msgs := append(validation.IsQualifiedName(t.Key), validation.IsValidLabelValue(t.Value)...); len(msgs) > 0 {
			return m, false, fmt.Errorf("taint %q: %s", layout.Truncate(t.Key, 64), strings.Join(msgs, "; "))
		}
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			return m, false, fmt.Errorf("taint %q: effect %q is not NoSchedule or NoExecute", t.Key, layout.Truncate(string(t.Effect), 32))
		}
	}
	plan, err := layout.Decode(e.Layout)
	if err != nil {
		return m, false, err
	}
	if errs := plan.Validate(rules); len(errs) > 0 {
		return m, false, errs.ToAggregate()
	}
	if e.LastSeen.IsZero() || e.LastSeen.After(now.Add(maxClockSkew)) {
		return m, false, fmt.Errorf("lastSeen %s is unset or in the future", e.LastSeen.UTC().Format(time.RFC3339))
	}
	m.Labels = e.Pool
	// The next node of the pool has the pool's labels, whatever was stored.
	m.NodeLabels = maps.Clone(e.NodeLabels)
	if m.NodeLabels == nil {
		m.NodeLabels = map[string]string{}
	}
	maps.Copy(m.NodeLabels, e.Pool)
	m.Taints = e.Taints
	m.Plan = plan
	m.LastSeen = e.LastSeen.Time
	return m, false, nil
}

// NextMemory merges what the pools publish now into what is stored: a live
// pool's entry is rewritten when its layout, labels or taints changed or its
// lastSeen is older than refresh; an entry whose pool is gone stays until it
// expires. It reports whether anything changed.
func NextMemory(stored, live []PoolMemory, now time.Time, remember, refresh time.Duration) ([]PoolMemory, bool) {
	byPool := make(map[string]PoolMemory, len(stored))
	for _, m := range stored {
		byPool[m.Pool] = m
	}
	changed := false
	seen := map[string]bool{}
	var out []PoolMemory
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
	slices.SortFunc(out, func(a, b PoolMemory) int { return strings.Compare(a.Pool, b.Pool) })
	if len(out) > MaxMemoryPools {
		// The most recently seen pools are the ones worth keeping.
		slices.SortStableFunc(out, func(a, b PoolMemory) int { return b.LastSeen.Compare(a.LastSeen) })
		out = out[:MaxMemoryPools]
		slices.SortFunc(out, func(a, b PoolMemory) int { return strings.Compare(a.Pool, b.Pool) })
		changed = true
	}
	return out, changed
}

func sameMemory(a, b PoolMemory) bool {
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
	now      func() time.Time
}

// NewMemory returns the memory of ConfigMap namespace/name.
func NewMemory(cfg *config.Configuration, idx *Index, c client.Client, namespace, name string, log logr.Logger) *Memory {
	return &Memory{cfg: cfg, idx: idx, client: c, namespace: namespace, name: name, log: log, Interval: 30 * time.Second, now: time.Now}
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
	mem, errs := DecodeMemory(data, m.cfg, m.now())
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
	now := m.now()
	cm := &corev1.ConfigMap{}
	err := m.client.Get(ctx, types.NamespacedName{Namespace: m.namespace, Name: m.name}, cm)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to read configmap %s/%s: %w", m.namespace, m.name, err)
	}
	stored, errs := DecodeMemory(cm.Data, m.cfg, now)
	next, changed := NextMemory(stored, m.idx.LivePools(now), now, m.cfg.Pinning.Remember(), m.refresh())
	if !changed && len(errs) == 0 && len(cm.Data) == len(stored) {
		return nil
	}
	data, err := EncodeMemory(next)
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
