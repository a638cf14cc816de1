package pools

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-injector/gpu-injector/layout"
)

const poolLabel = "karpenter.sh/nodepool"

// folderPlan is a driver in a folder of its own, inside the default allowlist.
func folderPlan(version string) layout.Plan {
	return layout.Plan{
		SchemaVersion: layout.SchemaVersion, DriverVersion: version, LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{
			{HostPath: "/usr/lib/nvidia-" + version, ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
			{HostPath: "/usr/lib/nvidia-" + version + "/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
		},
	}
}

func TestDecodeMemoryIsUntrusted(t *testing.T) {
	// The rules of the default configuration that folderPlan meets.
	rules := layout.Rules{
		HostPathAllowlist:  []layout.AllowedPath{{Path: "/usr/lib/nvidia-*"}, {Path: "/usr/lib", FilesOnly: true}},
		DriverFilePatterns: []string{"libcuda.so*", "libnvidia-*.so*", "nvidia-smi"},
		ContainerPathRoots: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"},
	}
	keys := []string{poolLabel}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	good := Memory{Pool: "karpenter.sh/nodepool=a", Labels: map[string]string{poolLabel: "a"}, Plan: folderPlan("535.104.05"), LastSeen: now.Add(-time.Hour)}
	enc := func(m Memory) string {
		d, err := EncodeMemory([]Memory{m})
		if err != nil {
			t.Fatal(err)
		}
		return d[MemoryKey(m.Pool)]
	}
	hostile := good
	hostile.Plan = folderPlan("535.104.05")
	hostile.Plan.Mounts[0].HostPath = "/etc"
	future := good
	future.LastSeen = now.Add(24 * time.Hour)
	badTaint := good
	badTaint.Taints = []corev1.Taint{{Key: "x", Effect: "PreferNoSchedule"}}
	badLabel := good
	badLabel.NodeLabels = map[string]string{"bad key!": "v"}
	other := good
	other.Labels = map[string]string{"cloud.google.com/gke-nodepool": "a"}
	other.Pool = "cloud.google.com/gke-nodepool=a"

	tests := map[string]struct {
		key, value string
		wantErr    string
	}{
		"good":                  {MemoryKey(good.Pool), enc(good), ""},
		"host path outside":     {MemoryKey(good.Pool), enc(hostile), "not under the host path allowlist"},
		"future lastSeen":       {MemoryKey(good.Pool), enc(future), "in the future"},
		"taint effect":          {MemoryKey(good.Pool), enc(badTaint), "PreferNoSchedule"},
		"node label":            {MemoryKey(good.Pool), enc(badLabel), "bad key!"},
		"key of another pool":   {MemoryKey("karpenter.sh/nodepool=b"), enc(good), "does not match"},
		"unknown field":         {MemoryKey(good.Pool), strings.Replace(enc(good), `{"pool"`, `{"extra":1,"pool"`, 1), "unknown field"},
		"trailing data":         {MemoryKey(good.Pool), enc(good) + "{}", "trailing"},
		"a closing brace after": {MemoryKey(good.Pool), enc(good) + "}", "trailing"},
		"a key twice":           {MemoryKey(good.Pool), strings.Replace(enc(good), `{"pool"`, `{"layout":"{}","pool"`, 1), `duplicate field "layout"`},
		"a label twice":         {MemoryKey(good.Pool), strings.Replace(enc(good), `"pool":{`, `"pool":{"a":"b","a":"c",`, 1), "duplicate field"},
		"a key in another case": {MemoryKey(good.Pool), strings.Replace(enc(good), `"lastSeen"`, `"LastSeen"`, 1), `unknown field "LastSeen"`},
		"not json":              {MemoryKey(good.Pool), "pool: a", "failed to decode"},
		"oversize":              {MemoryKey(good.Pool), strings.Repeat(" ", maxMemoryEntry+1), "exceeds the limit"},
		"other labels":          {MemoryKey(other.Pool), enc(other), ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			mem, errs := DecodeMemory(map[string]string{tc.key: tc.value}, keys, rules, now)
			if tc.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("errors: %v", errs)
				}
				if name == "good" && (len(mem) != 1 || mem[0].Plan.Fingerprint() != good.Plan.Fingerprint()) {
					t.Fatalf("memory = %+v", mem)
				}
				if name == "other labels" && len(mem) != 0 {
					t.Fatalf("an entry of other pinning labels must be skipped: %+v", mem)
				}
				return
			}
			if len(mem) != 0 || len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.wantErr) {
				t.Fatalf("memory %+v, errors %v; want one error containing %q", mem, errs, tc.wantErr)
			}
		})
	}
}
