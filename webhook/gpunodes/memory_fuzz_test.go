package gpunodes

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
	"github.com/gpu-injector/gpu-injector/webhook/internal/gputest"
)

// FuzzPoolMemory feeds the remembered pool layouts, a ConfigMap anyone with
// write access to the release namespace could edit, to DecodeMemory. What it
// accepts must be as safe as a node's layout (valid plan inside the
// allowlist, valid labels and taints, not from the future), survive a round
// trip through EncodeMemory, and a pod injected from a remembered pool gets
// read-only hostPaths inside the allowlist and the pool's node selector.
func FuzzPoolMemory(f *testing.F) {
	cfg, err := config.Parse([]byte("pinning: {nodeLabels: [karpenter.sh/nodepool, node.kubernetes.io/instance-type]}\n"))
	if err != nil {
		f.Fatal(err)
	}
	now := time.Date(2026, 11, 22, 21, 0, 0, 0, time.UTC)
	rules := cfg.Rules()
	keys := cfg.Pinning.NodeLabels

	good, err := pools.EncodeMemory([]pools.Memory{{
		Pool:       pools.Key(map[string]string{keys[0]: "gpu", keys[1]: "g5.xlarge"}, keys),
		Labels:     map[string]string{keys[0]: "gpu", keys[1]: "g5.xlarge"},
		NodeLabels: map[string]string{"topology.kubernetes.io/zone": "eu-west-1a"},
		Taints:     []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}},
		Plan:       gputest.Plan("535.104.05"),
		LastSeen:   now.Add(-time.Hour),
	}})
	if err != nil {
		f.Fatal(err)
	}
	for _, v := range good {
		f.Add(v, false)
		f.Add(strings.Replace(v, `"lastSeen":"2026-11-22T20:00:00Z"`, `"lastSeen":"2027-01-01T00:00:00Z"`, 1), false)
		f.Add(strings.Replace(v, `/usr/lib/nvidia-535.104.05/bin`, `/usr/lib/nvidia-535.104.05/../../../etc`, 1), false)
		f.Add(strings.Replace(v, `"NoSchedule"`, `"PreferNoSchedule"`, 1), true)
	}
	f.Add(`{"pool":{"karpenter.sh/nodepool":"a"},"layout":"{}","lastSeen":"2026-11-22T20:00:00Z"}`, false)
	f.Add(`{"pool":{"karpenter.sh/nodepool":"a","node.kubernetes.io/instance-type":"x"},"nodeLabels":{"a/b/c":"d"},"layout":"","lastSeen":null}`, true)

	// It tolerates every taint, so that whatever pool is remembered fits.
	pod := gputest.Pod("nvidia.com/gpu", func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	})
	f.Fuzz(func(t *testing.T, value string, wrongKey bool) {
		// The data key is a hash of the pool: derive it, unless asked not to.
		key := "pool-0000"
		var e struct {
			Pool map[string]string `json:"pool"`
		}
		if json.Unmarshal([]byte(value), &e) == nil && !wrongKey {
			key = pools.MemoryKey(pools.Key(e.Pool, keys))
		}
		mem, _ := pools.DecodeMemory(map[string]string{key: value}, cfg.Pinning.NodeLabels, cfg.Rules(), now)
		for _, m := range mem {
			if errs := m.Plan.Validate(rules); len(errs) > 0 {
				t.Fatalf("remembered plan accepted with errors: %v", errs.ToAggregate())
			}
			gputest.CheckPlanSafe(t, m.Plan, cfg)
			if m.LastSeen.After(now.Add(time.Hour)) || m.LastSeen.IsZero() {
				t.Fatalf("lastSeen %v accepted at %v", m.LastSeen, now)
			}
			if m.Pool == "" || m.Pool != pools.Key(m.Labels, keys) || len(m.Labels) != len(keys) {
				t.Fatalf("pool %q with labels %v", m.Pool, m.Labels)
			}
			for k, v := range m.Labels {
				if m.NodeLabels[k] != v {
					t.Fatalf("node labels %v lack the pool label %s=%s", m.NodeLabels, k, v)
				}
			}
			for k, v := range m.NodeLabels {
				if len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
					t.Fatalf("invalid node label %q=%q accepted", k, v)
				}
			}
			for _, tn := range m.Taints {
				if tn.Effect != corev1.TaintEffectNoSchedule && tn.Effect != corev1.TaintEffectNoExecute {
					t.Fatalf("taint %+v accepted", tn)
				}
			}
		}
		if len(mem) == 0 {
			return
		}

		// Round trip through what the elected replica writes.
		data, err := pools.EncodeMemory(mem)
		if err != nil {
			t.Fatalf("failed to re-encode: %v", err)
		}
		again, errs := pools.DecodeMemory(data, cfg.Pinning.NodeLabels, cfg.Rules(), now)
		if len(errs) > 0 || len(again) != len(mem) {
			t.Fatalf("re-encoded memory does not decode: %v", errs)
		}
		for i := range mem {
			a, b := mem[i], again[i]
			if a.Pool != b.Pool || a.Plan.Fingerprint() != b.Plan.Fingerprint() || !maps.Equal(a.NodeLabels, b.NodeLabels) ||
				!a.LastSeen.Truncate(time.Second).Equal(b.LastSeen) || !sameMemory(a, b) {
				t.Fatalf("round trip changed the memory:\n%+v\n%+v", a, b)
			}
		}

		// A pod for the pool at zero is served from memory.
		// The index ages the memory on the clock it was decoded at.
		idx := NewIndex(cfg, logr.Discard())
		idx.SetClock(clocktesting.NewFakePassiveClock(now))
		idx.SetMemory(mem)
		layouts := idx.Layouts()
		for _, l := range layouts {
			if l.Remembered == nil || l.Fingerprint != l.Plan.Fingerprint() {
				t.Fatalf("layout %s from memory: %+v", l.Fingerprint, l)
			}
		}
		p := pod.DeepCopy()
		gputest.CheckMutation(t, p, nil, layouts, cfg)
		// Pinned to the remembered pool: by its labels, or by fingerprint
		// where the mutation does not pin by pool.
		byPool := true
		for k, v := range mem[0].Labels {
			byPool = byPool && p.Spec.NodeSelector[k] == v
		}
		if !byPool && p.Spec.NodeSelector[layout.LabelFingerprint] != mem[0].Plan.Fingerprint() {
			t.Fatalf("a pod for a remembered pool is not pinned to it: %v", p.Spec.NodeSelector)
		}
	})
}
