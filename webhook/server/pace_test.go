package server

import (
	"context"
	"runtime/debug"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/gpunodes"
)

// gcPercent reads the collector's pace (setting it is the only way).
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestPaceFirstList(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	idx := gpunodes.NewIndex(config.Default(), logr.Discard())
	paceFirstList(context.Background(), idx, logr.Discard())
	if got := gcPercent(); got != listGCPercent {
		t.Fatalf("GC percent while listing = %d, want %d", got, listGCPercent)
	}
	if err := gpunodes.NewNodeStore(idx).Replace(nil, ""); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gcPercent() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("GC percent = %d after the first list, want 100 back", gcPercent())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Already collecting more often than the list's pace, or off: left alone.
	for _, pace := range []int{10, -1} {
		debug.SetGCPercent(pace)
		paceFirstList(context.Background(), gpunodes.NewIndex(config.Default(), logr.Discard()), logr.Discard())
		if got := gcPercent(); got != pace {
			t.Errorf("GC percent %d became %d", pace, got)
		}
	}
}
