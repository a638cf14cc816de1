package nriplugin

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestConnectThroughAReadOnlyMount checks what the chart relies on: the
// plugin's container mounts the runtime's socket folder read-only, and
// connect() on a unix socket still works there (the kernel's read-only
// check covers files, folders and links, not sockets), as uid 0 with every
// capability dropped. It needs root, to make a mount namespace and a
// read-only bind mount in it.
func TestConnectThroughAReadOnlyMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	src, dst := t.TempDir(), t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(src, "nri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(filepath.Join(src, "nri.sock"), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()

	errc := make(chan error, 1)
	go func() {
		// The thread moves to a mount namespace of its own and is never
		// given back to the scheduler: it ends with the goroutine.
		runtime.LockOSThread()
		errc <- connectReadOnly(src, dst)
	}()
	err = <-errc
	var skip skipErr
	if errors.As(err, &skip) {
		t.Skipf("no mount namespace here: %v", skip.error)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func connectReadOnly(src, dst string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return skipErr{err}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return skipErr{err}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return skipErr{err}
	}
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return skipErr{err}
	}
	// As the chart runs the plugin: uid 0 with no capability at all, so
	// only the socket's owner bits (root, 0600) let it in.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return errors.New("failed to drop every capability: " + err.Error())
	}
	// The mount is read-only: a file cannot be made there.
	if err := os.WriteFile(filepath.Join(dst, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		return errors.New("a write through the read-only mount did not fail with EROFS: " + errString(err))
	}
	// Raw calls: they run on this locked thread, in its namespace.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: filepath.Join(dst, "nri.sock")}); err != nil {
		return errors.New("connect through the read-only mount: " + err.Error())
	}
	buf := make([]byte, 2)
	if n, err := unix.Read(fd, buf); err != nil || string(buf[:n]) != "ok" {
		return errors.New("read through the read-only mount: " + errString(err))
	}
	return nil
}

type skipErr struct{ error }

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
