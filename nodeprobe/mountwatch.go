package nodeprobe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/moby/sys/mountinfo"

	"github.com/gpu-injector/gpu-injector/layout"
)

// DriverMountRoots are the host folders where a driver arrives as a mount of
// its own after the node booted: the GPU operator's driver container mounts
// its root at /run/nvidia/driver.
var DriverMountRoots = []string{"/run/nvidia"}

// DefaultHostMountTable is the host's mount table, relative to the host's
// root: init's, which is the host's mount namespace on every node.
const DefaultHostMountTable = "/proc/1/mountinfo"

// maxMountTable bounds a mount table read: a node has hundreds of mounts,
// each well under a KiB.
const maxMountTable = 8 << 20

// ErrHostMountsChanged is returned by the agent when a driver mount came or
// went on the host and the probe's container, whose copy of the host's
// mounts does not follow the host's (no mount propagation), cannot see it:
// the kubelet restarts the container, whose new copy has it.
var ErrHostMountsChanged = errors.New("the host's driver mounts changed")

// mountView compares the host's mounts under DriverMountRoots with the
// copy the probe's container has of them. A DaemonSet's pod spec is one for
// every node, and a runtime refuses a propagated mount of a path on a
// private mount (the host's / of a node that boots without systemd), so the
// chart asks for no propagation by default: a driver mounted later is then
// seen by this comparison, and a restart.
type mountView struct {
	// hostRoot is where the container sees the host's /; hostTable is the
	// host's mount table, through hostRoot; selfTable is the container's own.
	hostRoot, hostTable, selfTable string
	roots                          []string
}

func newMountView(hostRoot, table string) mountView {
	if table == "" {
		table = DefaultHostMountTable
	}
	return mountView{hostRoot: hostRoot, hostTable: filepath.Join(hostRoot, table), selfTable: "/proc/self/mountinfo", roots: DriverMountRoots}
}

// mountsUnder returns the mount points of the table at path that lie at or
// under one of roots below prefix, relative to prefix, sorted; and whether
// the deepest mount that holds prefix+roots[0] receives propagation from
// another mount (a slave or shared peer).
func mountsUnder(table, prefix string, roots []string) ([]string, bool, error) {
	f, err := os.Open(table)
	if err != nil {
		return nil, false, fmt.Errorf("failed to open mount table %s: %w", table, err)
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(io.LimitReader(f, maxMountTable), nil)
	if err != nil {
		return nil, false, fmt.Errorf("failed to read mount table %s: %w", table, err)
	}
	prefix = path.Clean("/" + prefix)
	var points []string
	depth, propagates := -1, false
	for _, m := range infos {
		rel, ok := strings.CutPrefix(m.Mountpoint, prefix)
		if prefix == "/" {
			rel, ok = m.Mountpoint, true
		}
		if !ok || (rel != "" && rel[0] != '/') {
			continue
		}
		rel = path.Clean("/" + rel)
		for _, r := range roots {
			if rel == r || strings.HasPrefix(rel, r+"/") {
				points = append(points, rel)
			}
		}
		// The mount that holds the first root: the deepest at or above it,
		// the last of equals (it hides the others).
		if r := roots[0]; (rel == r || strings.HasPrefix(r, strings.TrimSuffix(rel, "/")+"/")) && len(rel) >= depth {
			depth = len(rel)
			propagates = strings.Contains(m.Optional, "master:") || strings.Contains(m.Optional, "shared:")
		}
	}
	slices.Sort(points)
	return slices.Compact(points), propagates, nil
}

// changed compares the host's driver mounts with the container's copy: the
// mount points that differ, "" when none does; and whether the container's
// copy follows the host's.
func (v mountView) changed() (string, bool, error) {
	host, _, err := mountsUnder(v.hostTable, "/", v.roots)
	if err != nil {
		return "", false, err
	}
	own, propagates, err := mountsUnder(v.selfTable, v.hostRoot, v.roots)
	if err != nil {
		return "", false, err
	}
	var diff []string
	for _, p := range host {
		if _, found := slices.BinarySearch(own, p); !found {
			diff = append(diff, "+"+p)
		}
	}
	for _, p := range own {
		if _, found := slices.BinarySearch(host, p); !found {
			diff = append(diff, "-"+p)
		}
	}
	return strings.Join(diff, " "), propagates, nil
}

// watchMounts compares the mounts every poll until ctx ends, and sends
// ErrHostMountsChanged on errc once they differ. The label
// layout.LabelDriverMounts says which of the two routes the node has.
func (d *daemon) watchMounts(ctx context.Context, log logr.Logger, errc chan<- error) {
	d.watchMountsOf(ctx, log, errc, newMountView(d.probe.HostRoot, d.opts.HostMountTable))
}

func (d *daemon) watchMountsOf(ctx context.Context, log logr.Logger, errc chan<- error, v mountView) {
	poll := d.opts.MountPoll
	if poll <= 0 {
		poll = 10 * time.Second
	}
	warned := false
	// A difference already there at the first comparison is not one a
	// restart mends: the copy was just made from the runtime's mount
	// namespace, which is then not init's (a runtime in a namespace of its
	// own, as a snap's). Only a change from it restarts the probe, so such a
	// node never restarts in a loop.
	baseline, first := "", true
	for {
		diff, propagates, err := v.changed()
		if err == nil && first {
			baseline, first = diff, false
			if diff != "" {
				log.Info("the host's init has driver mounts that this container's runtime does not show it; only later changes restart the probe", "difference", diff)
			}
		}
		switch {
		case err != nil:
			// A host whose init's table is hidden (procfs hidepid): the
			// driver's mounts are then found at the next restart only.
			if !warned {
				log.Info("cannot compare the host's driver mounts with this container's; a driver mounted later is seen after a restart", "error", err.Error())
				warned = true
			}
		case diff != baseline:
			errc <- fmt.Errorf("%w (%s) and this container's copy of them does not follow the host's: restarting to see them", ErrHostMountsChanged, diff)
			return
		default:
			d.mountsPropagate.Store(propagates)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(poll):
		}
	}
}

// withMounts sets layout.LabelDriverMounts: how a driver mounted on the host
// later reaches this probe.
func (d *daemon) withMounts(p Published) Published {
	v := layout.DriverMountsRestart
	if d.mountsPropagate.Load() {
		v = layout.DriverMountsPropagated
	}
	return p.withLabel(layout.LabelDriverMounts, v)
}
