package nriplugin

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// syncBuffer is a log the plugin's goroutines write while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWaitsQuietlyWithoutNRI: on a node whose runtime has no NRI socket
// (containerd 1.x, NRI off), the plugin keeps running and retrying, says so
// once, logs no error, and registers nothing, so the probe puts no label on
// the node and its pods keep hostPath volumes.
func TestWaitsQuietlyWithoutNRI(t *testing.T) {
	dir := t.TempDir()
	var logs syncBuffer
	m := newMetrics()
	s := &server{opts: &Options{Socket: filepath.Join(t.TempDir(), "absent", "nri.sock"), StateDir: dir, PluginIndex: "50", HealthAddr: "0", MetricsAddr: "0"},
		log: nodeagent.NewLogger(&logs, 0), metrics: m,
		plugin: &Plugin{StateDir: dir, Rules: config.Default().Rules(), Log: nodeagent.NewLogger(&logs, 0), Count: m.count}}
	// Three tries at least: the first, then after 1s and 2s of backoff.
	ctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond)
	defer cancel()
	if err := s.run(ctx); err != nil {
		t.Fatalf("run without an NRI socket: %v, want it to wait until stopped", err)
	}
	out := logs.String()
	if n := strings.Count(out, "not connected to the container runtime's NRI"); n != 1 {
		t.Errorf("said %d times that it is not connected, want once:\n%s", n, out)
	}
	if strings.Contains(out, `"level":"error"`) {
		t.Errorf("logged an error:\n%s", out)
	}
	if p, err := statedir.ReadPlugin(dir); p != nil || err != nil {
		t.Errorf("plugin record %+v (%v), want none", p, err)
	}
	if value(t, m.registered) != 0 {
		t.Error("counted as registered")
	}
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	socket := -1.0
	for _, f := range families {
		if f.GetName() == "gpu_injector_nri_socket" {
			socket = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if socket != 0 {
		t.Errorf("gpu_injector_nri_socket = %v, want 0", socket)
	}
}
