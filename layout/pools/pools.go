// Package pools is the contract of pinning by pool: the key of a node's pool,
// the remembered pool layouts that the webhook keeps in a ConfigMap and
// reads back as strictly as a node's layout annotation, and the Event reason
// of a pod that landed on a node of another layout. The webhook writes them;
// `gpu-injector status` reads them without linking the webhook.
package pools

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-injector/gpu-injector/layout"
)

// ReasonLayoutMismatch is the Event reason on a pod pinned by its pool that
// landed on a node of the pool publishing another layout.
const ReasonLayoutMismatch = "LayoutMismatch"

// Memory is what is remembered of one pool: the layout its ready nodes
// published, and the labels and taints every one of them had, so that a pod
// for the pool at zero is matched against its next node as the scheduler and
// the autoscaler will.
type Memory struct {
	// Pool is the pool's key, Key of Labels.
	Pool string
	// Labels are the pinning labels and their values.
	Labels map[string]string
	// NodeLabels are the labels every node of the pool had (the pinning labels
	// among them), less the per-node ones.
	NodeLabels map[string]string
	// Taints are the NoSchedule and NoExecute taints every node of the pool had.
	Taints   []corev1.Taint
	Plan     layout.Plan
	LastSeen time.Time
	// Declared is set on a pool the configuration declares (Declared), which
	// has no LastSeen and never expires.
	Declared bool
}

// Key is the pool of a node with these labels: "k1=v1,k2=v2" in the order
// of keys, or "" when a label is missing (the node is in no pool). A value
// that is not a valid label value also leaves the node out of any pool: pods
// are pinned to a pool by a nodeSelector of these values, which the API
// server would refuse. It validates the labels of a Node, but not those of a
// --nodes file of the offline command or of Nodes built in code.
func Key(labels map[string]string, keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	var b strings.Builder
	for i, k := range keys {
		v, ok := labels[k]
		if !ok || len(validation.IsValidLabelValue(v)) != 0 {
			return ""
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	return b.String()
}

// KeySeparator joins the keys of the pools a pod is pinned to together
// (Join): pools whose nodes all publish one layout are one choice, so that
// spot and on-demand pools of one node image both serve the pod. Neither a
// label key nor a label value may hold a space.
const KeySeparator = " "

// Join is the pin of several pools, their keys sorted and joined by
// KeySeparator; one pool's pin is its key.
func Join(keys []string) string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return strings.Join(slices.Compact(keys), KeySeparator)
}

// Split is the keys of the pools a pin (Join) names.
func Split(pin string) []string {
	if pin == "" {
		return nil
	}
	return strings.Split(pin, KeySeparator)
}

// Labels is the labels a pool key (Key) names, nil when it is malformed.
func Labels(key string) map[string]string {
	if key == "" {
		return nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(key, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil
		}
		out[k] = v
	}
	return out
}

// The remembered pool layouts live in one ConfigMap in the webhook's own
// namespace: a restart keeps them, every replica reads them, and one elected
// replica writes them. Its content is treated like a node's annotation: an
// entry that does not decode strictly or breaks a layout rule is ignored.
const (
	// memoryKeyPrefix starts the data key of each pool's entry; the rest is a
	// hash of the pool key, which may hold characters a data key may not.
	memoryKeyPrefix = "pool-"
	// MaxMemory bounds what is read and written: far above any real
	// number of GPU pools, far below the ConfigMap's 1 MiB.
	MaxMemory      = 256
	maxMemoryEntry = layout.MaxAnnotationBytes + 16<<10
	maxNodeLabels  = 128
	maxPoolTaints  = 32
	// maxClockSkew is how far in the future a lastSeen may lie before the
	// entry counts as forged: a replica's clock may run a little ahead.
	maxClockSkew = time.Hour
)

// memoryEntry is the stored form of a Memory.
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
func EncodeMemory(mem []Memory) (map[string]string, error) {
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

// DecodeMemory reads ConfigMap data as the memories of the pools that the
// node label keys (the pinning labels) make, checking each entry against
// rules as strictly as a node's layout. Entries of other pinning labels (the
// configuration changed) are skipped silently; broken ones are skipped and
// returned as errors, to be logged and counted.
func DecodeMemory(data map[string]string, keys []string, rules layout.Rules, now time.Time) ([]Memory, []error) {
	var out []Memory
	var errs []error
	names := slices.Sorted(maps.Keys(data))
	if len(names) > MaxMemory {
		errs = append(errs, fmt.Errorf("the memory holds %d entries, more than %d: the rest is ignored", len(names), MaxMemory))
		names = names[:MaxMemory]
	}
	for _, k := range names {
		m, skip, err := decodeEntry(k, data[k], keys, rules, now)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("entry %s: %w", k, err))
		case !skip:
			out = append(out, m)
		}
	}
	return out, errs
}

func decodeEntry(key, value string, keys []string, rules layout.Rules, now time.Time) (Memory, bool, error) {
	var m Memory
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
	if len(e.Pool) != len(keys) || Key(e.Pool, keys) == "" {
		// Written under other pinning labels: not an error, just not ours now.
		return m, true, nil
	}
	if key != MemoryKey(Key(e.Pool, keys)) {
		return m, false, fmt.Errorf("data key does not match pool %q", Key(e.Pool, keys))
	}
	if e.LastSeen.IsZero() || e.LastSeen.After(now.Add(maxClockSkew)) {
		return m, false, fmt.Errorf("lastSeen %s is unset or in the future", e.LastSeen.UTC().Format(time.RFC3339))
	}
	m, err := checkEntry(e.Pool, e.NodeLabels, e.Taints, e.Layout, keys, rules)
	m.LastSeen = e.LastSeen.Time
	return m, false, err
}

// MaxDeclared bounds the pools a configuration declares: each is checked and
// served like a remembered one.
const MaxDeclared = 64

// Declared is the memory of a pool that the configuration declares: the
// pool's pinning labels and their values, the other labels and the taints
// its nodes get from their template, and the layout they publish (the
// gpu-injector.io/layout annotation, as `gpu-injector nodeprobe --once -o
// layout` prints it on a machine of the pool's node image). It is checked as
// strictly as a remembered entry, since it is served the same way.
func Declared(pool, nodeLabels map[string]string, taints []corev1.Taint, plan string, keys []string, rules layout.Rules) (Memory, error) {
	if len(pool) != len(keys) || Key(pool, keys) == "" {
		return Memory{}, fmt.Errorf("the pool must give a value to each pinning label (%s) and to no other", strings.Join(keys, ", "))
	}
	if len(plan) > layout.MaxAnnotationBytes {
		return Memory{}, fmt.Errorf("the layout's %d bytes exceed the limit of %d", len(plan), layout.MaxAnnotationBytes)
	}
	m, err := checkEntry(pool, nodeLabels, taints, plan, keys, rules)
	m.Declared = true
	return m, err
}

// checkEntry is the memory of one pool's entry, which keys (the pinning
// labels) name and pool has every one of, checked against rules.
func checkEntry(pool, nodeLabels map[string]string, taints []corev1.Taint, plan string, keys []string, rules layout.Rules) (Memory, error) {
	var m Memory
	m.Pool = Key(pool, keys)
	if len(nodeLabels) > maxNodeLabels {
		return m, fmt.Errorf("%d node labels exceed the limit of %d", len(nodeLabels), maxNodeLabels)
	}
	for k, v := range nodeLabels {
		if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
			return m, fmt.Errorf("node label %q: %s", layout.Truncate(k, 64), strings.Join(msgs, "; "))
		}
	}
	for k, v := range pool {
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return m, fmt.Errorf("pool label %s: %s", k, strings.Join(msgs, "; "))
		}
	}
	if len(taints) > maxPoolTaints {
		return m, fmt.Errorf("%d taints exceed the limit of %d", len(taints), maxPoolTaints)
	}
	for _, t := range taints {
		if msgs := append(validation.IsQualifiedName(t.Key), validation.IsValidLabelValue(t.Value)...); len(msgs) > 0 {
			return m, fmt.Errorf("taint %q: %s", layout.Truncate(t.Key, 64), strings.Join(msgs, "; "))
		}
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			return m, fmt.Errorf("taint %q: effect %q is not NoSchedule or NoExecute", t.Key, layout.Truncate(string(t.Effect), 32))
		}
	}
	p, err := layout.Decode(plan)
	if err != nil {
		return m, err
	}
	if errs := p.Validate(rules); len(errs) > 0 {
		return m, errs.ToAggregate()
	}
	m.Labels = pool
	// The next node of the pool has the pool's labels, whatever was stored.
	m.NodeLabels = maps.Clone(nodeLabels)
	if m.NodeLabels == nil {
		m.NodeLabels = map[string]string{}
	}
	maps.Copy(m.NodeLabels, pool)
	m.Taints = taints
	m.Plan = p
	return m, nil
}
