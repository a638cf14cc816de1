package nodeprobe

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpu-injector/gpu-injector/internal/wallclock"
	"github.com/gpu-injector/gpu-injector/nodeprobe/hostroot"
)

// Where a driver that arrives after the probe started shows first: the NVIDIA
// GPU operator's validator writes driver-ready once the driver container's
// driver works (NVIDIA/gpu-operator cmd/nvidia-validator/main.go: defaultStatusPath
// /run/nvidia/validations, driverStatusFile "driver-ready"), and the driver
// container creates its root folder /run/nvidia/driver before it mounts its
// root there. A mount makes no inotify event, so the marker is what tells the
// operator's driver; a driver a package or an image puts in the host's own
// folders is told by the files appearing in the folders the probe searches.
// The kernel module's version files are in procfs and sysfs, which send no
// inotify events: the periodic probe stays the backstop for what no folder
// shows.
var operatorWatchDirs = []string{"/run/nvidia", "/run/nvidia/validations", "/run/nvidia/driver"}

// driverWatchDirs are the host folders the watch follows: the operator's,
// and the folders the probe searches for the driver's libraries and
// programs (a folder with a '*' is followed through its parent).
func driverWatchDirs() []string {
	var out []string
	for _, d := range slices.Concat(operatorWatchDirs, libraryFolders, binaryFolders) {
		for strings.Contains(d, "*") {
			d = path.Dir(d)
		}
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// driverWatch asks for a probe when the driver's files change, so that a
// driver installed or upgraded after the probe started is published within
// seconds rather than at the next interval. It follows each folder of
// driverWatchDirs that exists, or else its deepest existing parent, so that
// the folder's creation is seen and then followed in turn. A burst of
// changes (a package unpacking hundreds of files) is one probe once the
// folders are quiet, and one more a little later for the files that came
// after it; probes are at least minGap apart.
type driverWatch struct {
	root string
	log  logr.Logger
	// probe is called, on the watch's goroutine, when a probe is due.
	probe func()

	// quiet is how long the folders stay unchanged before a probe; maxWait
	// bounds the wait from the first change; settle is when the second probe
	// of a burst comes; minGap is the least time between two probes.
	quiet, maxWait, settle, minGap time.Duration
	clock                          clock.Clock

	w       *fsnotify.Watcher
	watched map[string]bool
}

func newDriverWatch(root string, log logr.Logger, probe func()) *driverWatch {
	return &driverWatch{root: root, log: log, probe: probe,
		quiet: time.Second, maxWait: 3 * time.Second, settle: 5 * time.Second, minGap: 2 * time.Second,
		clock: wallclock.Real()}
}

// arm follows every folder of driverWatchDirs, or its deepest existing
// parent, that is not followed yet. Links are resolved within the host
// root, so a link on the host cannot point the watch at the probe's own
// files. It returns how many folders it added.
func (dw *driverWatch) arm() int {
	added := 0
	for _, d := range driverWatchDirs() {
		for {
			host, err := hostroot.Resolve(dw.root, d)
			if err == nil {
				p := hostroot.OSPath(dw.root, host)
				if _, tried := dw.watched[p]; !tried {
					err := dw.w.Add(p)
					if err != nil {
						dw.log.V(1).Info("driver watch: cannot follow a folder", "path", host, "error", err.Error())
					} else {
						added++
					}
					// Tried once: a folder the probe may not read is not
					// asked again at every change.
					dw.watched[p] = err == nil
				}
				break
			}
			if d == "/" || !errors.Is(err, fs.ErrNotExist) {
				break
			}
			d = path.Dir(d)
		}
	}
	return added
}

// rearm follows what an event may have changed: a folder created (followed
// from now on, with what it now holds), or a followed folder removed or
// renamed (the kernel dropped its watch; its parent is followed instead).
func (dw *driverWatch) rearm(ev fsnotify.Event) {
	switch {
	case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
		if _, ok := dw.watched[ev.Name]; !ok {
			return
		}
		delete(dw.watched, ev.Name)
		// A failed folder may be readable now, where it is recreated.
		for p, ok := range dw.watched {
			if !ok {
				delete(dw.watched, p)
			}
		}
	case ev.Has(fsnotify.Create):
		fi, err := os.Lstat(ev.Name)
		if err != nil || (!fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0) {
			return
		}
	default:
		return
	}
	dw.arm()
}

// run follows the folders until ctx ends. It returns an error only when no
// watch could be set up at all (no inotify instance left for the probe's
// user); the periodic probe then carries on alone.
func (dw *driverWatch) run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	dw.w, dw.watched = w, map[string]bool{}
	dw.log.V(1).Info("driver watch started", "folders", dw.arm())

	timer := dw.clock.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var first, last, lastProbe time.Time
	settling := false
	changed := func() {
		now := dw.clock.Now()
		if first.IsZero() {
			first = now
		}
		last, settling = now, false
		timer.Reset(minTime(now.Add(dw.quiet), first.Add(dw.maxWait)).Sub(now))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflowed queue lost events: probe as for a change.
			dw.log.V(1).Info("driver watch error", "error", err.Error())
			changed()
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			dw.rearm(ev)
			changed()
		case <-timer.C():
			now := dw.clock.Now()
			if !lastProbe.IsZero() && now.Sub(lastProbe) < dw.minGap {
				timer.Reset(lastProbe.Add(dw.minGap).Sub(now))
				continue
			}
			dw.probe()
			lastProbe, first = now, time.Time{}
			if !settling {
				settling = true
				timer.Reset(last.Add(dw.settle).Sub(now))
			} else {
				settling = false
			}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
