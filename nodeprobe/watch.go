package nodeprobe

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
)

// DefaultNVMLTimeout bounds one reading of NVML, from nvmlInit to
// nvmlShutdown. A working driver answers in well under a second (nvmlInit
// with persistence mode off takes a few seconds on an 8-GPU node); a wedged
// one never does. The limit is also how long a probe, and so the first
// publication after a start, waits on a driver that does not answer.
const DefaultNVMLTimeout = 30 * time.Second

// NVMLWatch reads NVML on a goroutine of its own, with a deadline. NVML
// calls cannot be cancelled: a call into a wedged kernel module may never
// return, and its goroutine, with the OS thread cgo holds for it, stays
// stuck. So a watch starts no second reading while one is stuck: until it
// returns, every probe reports that same stuck call at once, and the process
// holds one stuck thread however long the wedge lasts (and however many
// probes, SIGHUPs and intervals pass) instead of one more per probe.
//
// An NVMLWatch is safe for concurrent use; its zero value uses
// DefaultNVMLTimeout.
type NVMLWatch struct {
	// Timeout bounds one reading; 0 means DefaultNVMLTimeout.
	Timeout time.Duration
	// Returned, if set, is called (on the reading's goroutine) when a
	// reading that was reported stuck returns at last: the driver answers
	// again, and the agent probes at once rather than at its next interval.
	Returned func()
	// Clock stamps the call a stuck reading names; nil means the real one.
	Clock clock.PassiveClock

	mu    sync.Mutex
	stuck *nvmlReading
}

// nvmlReading is one run of open and ReadNVML on its goroutine.
type nvmlReading struct {
	// call is the NVML call in progress, for the message that names it.
	call  atomic.Pointer[nvmlCall]
	clock clock.PassiveClock
	// done receives the outcome once; buffered, so the goroutine never
	// blocks on a reader that gave up.
	done chan nvmlOutcome
	// reported is set, under NVMLWatch.mu, once a probe reported it stuck.
	reported bool
}

type nvmlCall struct {
	name string
	at   time.Time
}

type nvmlOutcome struct {
	res NVMLResult
	err error
}

func (r *nvmlReading) step(name string) {
	r.call.Store(&nvmlCall{name: name, at: r.clock.Now()})
}

func (w *NVMLWatch) timeout() time.Duration {
	if w.Timeout > 0 {
		return w.Timeout
	}
	return DefaultNVMLTimeout
}

// Read opens the library with open and reads it with ReadNVML, both on a
// goroutine of their own, and waits at most Timeout. A reading that does not
// finish in time is NVMLTimeout, naming the call that did not return and
// when it was made; while it stays stuck, Read answers the same at once
// without calling open or NVML again. The error is open's.
func (w *NVMLWatch) Read(open func() (NVML, error)) (NVMLResult, error) {
	w.mu.Lock()
	if r := w.stuck; r != nil {
		w.mu.Unlock()
		return r.result(w.timeout()), nil
	}
	r := &nvmlReading{done: make(chan nvmlOutcome, 1), clock: wallclock.Or(w.Clock)}
	r.step("loading the NVML library")
	w.mu.Unlock()

	go w.run(r, open)
	timer := time.NewTimer(w.timeout())
	defer timer.Stop()
	select {
	case o := <-r.done:
		return o.res, o.err
	case <-timer.C:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// It may have returned between the deadline and the lock: that is an
	// answer, not a wedge.
	select {
	case o := <-r.done:
		return o.res, o.err
	default:
	}
	r.reported = true
	w.stuck = r
	return r.result(w.timeout()), nil
}

func (w *NVMLWatch) run(r *nvmlReading, open func() (NVML, error)) {
	var o nvmlOutcome
	if lib, err := open(); err != nil {
		o.err = err
	} else {
		o.res = readNVML(lib, r.step)
	}
	w.mu.Lock()
	r.done <- o
	reported := r.reported
	if w.stuck == r {
		w.stuck = nil
	}
	w.mu.Unlock()
	if reported && w.Returned != nil {
		w.Returned()
	}
}

// result is what a stuck reading reports. It names the call and the time it
// was made, not how long ago: every probe of one wedge then publishes the
// same message, and a steady wedge causes no writes.
func (r *nvmlReading) result(limit time.Duration) NVMLResult {
	c := r.call.Load()
	return NVMLResult{State: NVMLTimeout, Message: fmt.Sprintf("%s has not returned within %s (called at %s)",
		c.name, limit, c.at.UTC().Format(time.RFC3339))}
}
