package nodeprobe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// TestMountViewChanged: a driver mounted on the host after the container
// started (the GPU operator's /run/nvidia/driver) is a difference until the
// container's copy has it; one unmounted on the host is one too; mounts
// elsewhere are none; a copy that is a slave of the host's propagates.
func TestMountViewChanged(t *testing.T) {
	const hostBase = "21 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n" +
		"22 21 0:20 / /run rw,nosuid shared:2 - tmpfs tmpfs rw\n"
	const driver = "90 22 0:50 / /run/nvidia/driver rw shared:40 - overlay overlay rw\n" +
		"91 90 0:51 / /run/nvidia/driver/proc rw shared:41 - proc proc rw\n"
	const otherMount = "95 22 0:60 / /run/user/1000 rw shared:50 - tmpfs tmpfs rw\n"
	// The container's: its root, and the host's / again at /host, private.
	const selfBase = "500 400 0:70 / / rw - overlay overlay rw\n" +
		"501 500 254:0 / /host ro - ext4 /dev/vda rw\n" +
		"502 501 0:20 / /host/run ro - tmpfs tmpfs rw\n"
	const selfDriver = "503 502 0:50 / /host/run/nvidia/driver ro - overlay overlay rw\n" +
		"504 503 0:51 / /host/run/nvidia/driver/proc ro - proc proc rw\n"
	const selfSlave = "500 400 0:70 / / rw - overlay overlay rw\n" +
		"501 500 254:0 / /host ro master:1 - ext4 /dev/vda rw\n" +
		"502 501 0:20 / /host/run ro master:2 - tmpfs tmpfs rw\n"

	for name, tc := range map[string]struct {
		host, self string
		diff       string
		propagates bool
	}{
		"no driver mount":             {host: hostBase, self: selfBase},
		"a mount elsewhere came":      {host: hostBase + otherMount, self: selfBase},
		"the driver's mount came":     {host: hostBase + driver, self: selfBase, diff: "+/run/nvidia/driver +/run/nvidia/driver/proc"},
		"the copy has it":             {host: hostBase + driver, self: selfBase + selfDriver},
		"the driver's mount went":     {host: hostBase, self: selfBase + selfDriver, diff: "-/run/nvidia/driver -/run/nvidia/driver/proc"},
		"a slave copy follows":        {host: hostBase, self: selfSlave, propagates: true},
		"a slave copy with the mount": {host: hostBase + driver, self: selfSlave + selfDriver, propagates: true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			v := mountView{hostRoot: "/host", hostTable: filepath.Join(dir, "host"), selfTable: filepath.Join(dir, "self"), roots: DriverMountRoots}
			if err := os.WriteFile(v.hostTable, []byte(tc.host), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(v.selfTable, []byte(tc.self), 0o600); err != nil {
				t.Fatal(err)
			}
			diff, propagates, err := v.changed()
			if err != nil {
				t.Fatal(err)
			}
			if diff != tc.diff || propagates != tc.propagates {
				t.Errorf("changed() = %q, propagates %v; want %q, %v", diff, propagates, tc.diff, tc.propagates)
			}
		})
	}
}

// TestMountViewUnreadable: a host table the probe may not read is an error,
// never a difference that would restart the probe in a loop.
func TestMountViewUnreadable(t *testing.T) {
	v := newMountView(t.TempDir(), "")
	if diff, _, err := v.changed(); err == nil || diff != "" {
		t.Fatalf("changed() = %q, %v; want an error and no difference", diff, err)
	}
}

// TestWatchMountsBaseline: a difference the container starts with (a runtime
// whose mount namespace is not init's) never restarts the probe; a change
// from it does.
func TestWatchMountsBaseline(t *testing.T) {
	const self = "500 400 0:70 / / rw - overlay overlay rw\n501 500 254:0 / /host ro - ext4 /dev/vda rw\n"
	const atStart = "21 1 254:0 / / rw shared:1 - ext4 /dev/vda rw\n90 21 0:50 / /run/nvidia/driver rw shared:40 - overlay overlay rw\n"
	const later = atStart + "92 21 0:52 / /run/nvidia/extra rw shared:42 - tmpfs tmpfs rw\n"
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc", "1"), 0o755); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(root, "proc", "1", "mountinfo")
	selfTable := filepath.Join(t.TempDir(), "self")
	if err := os.WriteFile(host, []byte(atStart), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(selfTable, []byte(self), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &daemon{opts: &Options{MountPoll: 5 * time.Millisecond}, probe: ProbeOptions{HostRoot: root}}
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.watchMountsOf(ctx, logr.Discard(), errc, mountView{hostRoot: "/host", hostTable: host, selfTable: selfTable, roots: DriverMountRoots})
	select {
	case err := <-errc:
		t.Fatalf("restarted for a difference it started with: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := os.WriteFile(host, []byte(later), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrHostMountsChanged) {
			t.Fatalf("err = %v, want ErrHostMountsChanged", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no restart for a mount that came after the start")
	}
}
