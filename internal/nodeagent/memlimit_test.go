package nodeagent

import (
	"bytes"
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

func TestSoftLimit(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct{ limit, want int64 }{
		{0, 0},
		{-1, 0},
		// The chart's defaults: the webhook's, the probe's, the NRI plugin's.
		{256 * mi, 224 * mi},
		{128 * mi, 96 * mi},
		{64 * mi, 32 * mi},
		// Under 64 MiB: half.
		{48 * mi, 24 * mi},
		// From 320 MiB on: 90 %.
		{320 * mi, 288 * mi},
		{1024 * mi, 1024*mi - 1024*mi/10},
	} {
		if got := SoftLimit(tc.limit); got != tc.want {
			t.Errorf("SoftLimit(%d MiB) = %.1f MiB, want %.1f MiB", tc.limit/mi, float64(got)/mi, float64(tc.want)/mi)
		}
	}
}

func TestMemoryLimit(t *testing.T) {
	for name, tc := range map[string]struct {
		env                   map[string]string
		soft, container       int64
		source, errorContains string
	}{
		"nothing set":     {env: map[string]string{}},
		"the container's": {env: map[string]string{MemoryLimitEnv: "268435456"}, soft: 224 << 20, container: 256 << 20, source: MemoryLimitEnv},
		"GOMEMLIMIT wins": {env: map[string]string{MemoryLimitEnv: "268435456", "GOMEMLIMIT": "100MiB"}, source: "GOMEMLIMIT"},
		"not bytes":       {env: map[string]string{MemoryLimitEnv: "256Mi"}, source: MemoryLimitEnv, errorContains: "256Mi"},
		"zero":            {env: map[string]string{MemoryLimitEnv: "0"}, source: MemoryLimitEnv, errorContains: "in bytes"},
		"blank is none":   {env: map[string]string{MemoryLimitEnv: " "}},
	} {
		t.Run(name, func(t *testing.T) {
			soft, container, source, err := MemoryLimit(func(k string) string { return tc.env[k] })
			if tc.errorContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errorContains) {
					t.Errorf("error = %v, want one containing %q", err, tc.errorContains)
				}
				return
			}
			if err != nil || soft != tc.soft || container != tc.container || source != tc.source {
				t.Errorf("= %d, %d, %q, %v; want %d, %d, %q", soft, container, source, err, tc.soft, tc.container, tc.source)
			}
		})
	}
}

func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	t.Setenv(MemoryLimitEnv, "268435456")
	var logs bytes.Buffer
	if got := SetMemoryLimit(NewLogger(&logs, 0)); got != 224<<20 {
		t.Errorf("SetMemoryLimit = %d, want 224 MiB", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 224<<20 {
		t.Errorf("the runtime's limit is %d, want 224 MiB", got)
	}
	if !strings.Contains(logs.String(), `"memoryLimit":"224.0MiB","containerLimit":"256.0MiB"`) {
		t.Errorf("log does not give both limits: %s", logs.String())
	}

	debug.SetMemoryLimit(math.MaxInt64)
	logs.Reset()
	t.Setenv(MemoryLimitEnv, "lots")
	if got := SetMemoryLimit(NewLogger(&logs, 0)); got != 0 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("a bad value set a limit: %d", got)
	}
	if !strings.Contains(logs.String(), "lots") {
		t.Errorf("log does not name the bad value: %s", logs.String())
	}
}
