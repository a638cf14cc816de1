package nodeprobe

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// startDriverWatch runs a watch over root with short waits and returns the
// probes it asked for, counted.
func startDriverWatch(t *testing.T, root string) *atomic.Int32 {
	t.Helper()
	var probes atomic.Int32
	dw := newDriverWatch(root, logr.Discard(), func() { probes.Add(1) })
	dw.quiet, dw.maxWait, dw.settle, dw.minGap = 50*time.Millisecond, 200*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dw.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// The watch is set up before run's first select; give it that long.
	time.Sleep(100 * time.Millisecond)
	return &probes
}

func waitProbes(t *testing.T, probes *atomic.Int32, atLeast int32, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for probes.Load() < atLeast {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d probes asked for, want at least %d", what, probes.Load(), atLeast)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeHostFile(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDriverWatchOperatorMarker: on a node that had no driver at all, the GPU
// operator's validator writes its driver-ready marker under folders that did
// not exist when the probe started; the watch follows them as they appear.
func TestDriverWatchOperatorMarker(t *testing.T) {
	root := t.TempDir()
	probes := startDriverWatch(t, root)
	if err := os.MkdirAll(filepath.Join(root, "run/nvidia/driver"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitProbes(t, probes, 1, "/run/nvidia/driver created")
	time.Sleep(600 * time.Millisecond) // the burst's second probe
	before := probes.Load()
	writeHostFile(t, root, "run/nvidia/validations/driver-ready", "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n")
	waitProbes(t, probes, before+1, "driver-ready written")
}

// TestDriverWatchPackageInstall: a driver package unpacks into a folder the
// probe searches, created with its parents after the start, and a burst of
// files is a few probes, not one per file. A removed folder is followed again
// when it comes back (an upgrade that replaces it).
func TestDriverWatchPackageInstall(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "home"), 0o755); err != nil {
		t.Fatal(err)
	}
	probes := startDriverWatch(t, root)
	for i := range 200 {
		writeHostFile(t, root, "home/kubernetes/bin/nvidia/lib64/libnvidia-"+strconv.Itoa(i)+".so.535.104.05", "x")
	}
	waitProbes(t, probes, 1, "driver unpacked under /home/kubernetes/bin/nvidia/lib64")
	time.Sleep(time.Second)
	if n := probes.Load(); n > 4 {
		t.Errorf("a burst of 200 files asked for %d probes, want a few", n)
	}

	if err := os.RemoveAll(filepath.Join(root, "home/kubernetes")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	before := probes.Load()
	writeHostFile(t, root, "home/kubernetes/bin/nvidia/lib64/libcuda.so.580.65.06", "x")
	waitProbes(t, probes, before+1, "driver folder recreated")
	time.Sleep(600 * time.Millisecond)
	before = probes.Load()
	writeHostFile(t, root, "home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.580.65.06", "x")
	waitProbes(t, probes, before+1, "file added to the recreated folder")
}

// TestDriverWatchStaysInRoot: a host link out of the root is resolved on the
// host, so the watch follows the host's folder, not the probe's.
func TestDriverWatchStaysInRoot(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "run/nvidia")); err != nil {
		t.Fatal(err)
	}
	probes := startDriverWatch(t, root)
	writeHostFile(t, outside, "validations/driver-ready", "x")
	time.Sleep(500 * time.Millisecond)
	if n := probes.Load(); n != 0 {
		t.Errorf("a change outside the host root asked for %d probes", n)
	}
}
