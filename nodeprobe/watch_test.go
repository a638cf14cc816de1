package nodeprobe

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// blockingNVML is fakeNVML whose call named by at blocks until release is
// closed, as a call into a wedged kernel module does; calls counts the
// readings that reached nvmlInit.
func blockingNVML(t *testing.T, at string) (lib *mock.Interface, calls *atomic.Int32, release func()) {
	t.Helper()
	m := fakeNVML("580.159.04", 13000, h100)
	gate := make(chan struct{})
	calls = &atomic.Int32{}
	block := func() { <-gate }
	init := m.InitFunc
	m.InitFunc = func() nvml.Return {
		calls.Add(1)
		if at == "nvmlInit" {
			block()
		}
		return init()
	}
	if at == "nvmlDeviceGetCount" {
		count := m.DeviceGetCountFunc
		m.DeviceGetCountFunc = func() (int, nvml.Return) {
			block()
			return count()
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	// A stuck goroutine must not outlive the test.
	t.Cleanup(release)
	return m, calls, release
}

func TestNVMLWatchReportsTheStuckCall(t *testing.T) {
	for _, at := range []string{"nvmlInit", "nvmlDeviceGetCount"} {
		t.Run(at, func(t *testing.T) {
			lib, _, _ := blockingNVML(t, at)
			w := &NVMLWatch{Timeout: 50 * time.Millisecond}
			start := time.Now()
			res, err := w.Read(func() (NVML, error) { return lib, nil })
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Read took %s with a 50ms limit", took)
			}
			if res.State != NVMLTimeout || !strings.HasPrefix(res.Message, at+" has not returned within 50ms (called at ") {
				t.Errorf("Read = %s %q, want %s naming %s", res.State, res.Message, NVMLTimeout, at)
			}
		})
	}
}

// TestNVMLWatchDoesNotPileUp: while a reading is stuck, further probes
// report it at once and call neither open nor NVML again; when it returns,
// Returned is called and the next reading answers.
func TestNVMLWatchDoesNotPileUp(t *testing.T) {
	lib, calls, release := blockingNVML(t, "nvmlInit")
	returned := make(chan struct{}, 1)
	// A limit well above a loaded machine's scheduling delays: a Read that
	// waits for it cannot pass for one that answers at once.
	w := &NVMLWatch{Timeout: time.Second, Returned: func() { returned <- struct{}{} }}
	var opens atomic.Int32
	open := func() (NVML, error) {
		opens.Add(1)
		return lib, nil
	}
	first, _ := w.Read(open)
	if first.State != NVMLTimeout {
		t.Fatalf("first Read = %s %q, want %s", first.State, first.Message, NVMLTimeout)
	}
	for range 5 {
		start := time.Now()
		again, _ := w.Read(open)
		if again != first {
			t.Errorf("Read during the wedge = %+v, want the same report %+v (a steady wedge must publish the same message)", again, first)
		}
		if took := time.Since(start); took > w.Timeout/2 {
			t.Errorf("Read during the wedge waited %s: it must answer at once", took)
		}
	}
	if opens.Load() != 1 || calls.Load() != 1 {
		t.Errorf("%d opens and %d nvmlInit calls during one wedge, want 1 each: stuck calls pile up", opens.Load(), calls.Load())
	}
	select {
	case <-returned:
		t.Fatal("Returned called before the stuck call returned")
	default:
	}
	release()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Returned not called after the stuck call returned")
	}
	res, err := w.Read(open)
	if err != nil || res.State != NVMLOK {
		t.Fatalf("Read after the driver answered = %s %q, %v; want OK", res.State, res.Message, err)
	}
	if calls.Load() != 2 {
		t.Errorf("%d nvmlInit calls, want 2", calls.Load())
	}
}

// TestNVMLWatchAnswerInTime: a reading that finishes in time is returned as
// it is, and Returned, which is for readings reported stuck, is not called.
func TestNVMLWatchAnswerInTime(t *testing.T) {
	called := false
	w := &NVMLWatch{Timeout: 10 * time.Second, Returned: func() { called = true }}
	res, err := w.Read(func() (NVML, error) { return fakeNVML("580.159.04", 13000, h100), nil })
	if err != nil || res.State != NVMLOK || res.Facts.DriverVersion != "580.159.04" {
		t.Fatalf("Read = %+v, %v", res, err)
	}
	// open's error is the caller's (a library that changed, an unusable one).
	if _, err := w.Read(func() (NVML, error) { return nil, ErrNVMLReload }); err != ErrNVMLReload {
		t.Errorf("Read with a failing open = %v, want its error", err)
	}
	if called {
		t.Error("Returned called for readings that were never stuck")
	}
}

func TestReadNVMLGPULost(t *testing.T) {
	lost := func(ret nvml.Return) *mock.Interface {
		m := fakeNVML("580.159.04", 13000, h100, h100)
		handle := m.DeviceGetHandleByIndexFunc
		m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
			if i == 1 {
				return nil, ret
			}
			return handle(i)
		}
		return m
	}
	initLost := fakeNVML("", 0)
	initLost.InitFunc = func() nvml.Return { return nvml.ERROR_GPU_IS_LOST }
	memLost := fakeNVML("580.159.04", 13000, h100)
	handle := memLost.DeviceGetHandleByIndexFunc
	memLost.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		d, ret := handle(i)
		d.(*mock.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
		return d, ret
	}
	for name, tc := range map[string]struct {
		lib  NVML
		want NVMLState
		msg  string
	}{
		"second GPU lost":       {lib: lost(nvml.ERROR_GPU_IS_LOST), want: NVMLGPULost, msg: "nvmlDeviceGetHandleByIndex(1) failed: ERROR_GPU_IS_LOST"},
		"reset required":        {lib: lost(nvml.ERROR_RESET_REQUIRED), want: NVMLGPULost, msg: "nvmlDeviceGetHandleByIndex(1) failed: ERROR_RESET_REQUIRED"},
		"lost at init":          {lib: initLost, want: NVMLGPULost, msg: "nvmlInit failed: ERROR_GPU_IS_LOST"},
		"lost reading memory":   {lib: memLost, want: NVMLGPULost, msg: "nvmlDeviceGetMemoryInfo(0) failed: ERROR_GPU_IS_LOST"},
		"other errors stay one": {lib: lost(nvml.ERROR_UNKNOWN), want: NVMLError, msg: "ERROR_UNKNOWN"},
	} {
		t.Run(name, func(t *testing.T) {
			res := ReadNVML(tc.lib)
			if res.State != tc.want || !strings.Contains(res.Message, tc.msg) {
				t.Errorf("ReadNVML = %s %q, want %s with %q", res.State, res.Message, tc.want, tc.msg)
			}
		})
	}
}
