//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// childError carries the exit code podsim reports for a failure in the child.
type childError struct {
	code int
	err  error
}

func (e *childError) Error() string { return e.err.Error() }

// runChild is the container's init: it runs in the new namespaces, builds
// the container's filesystem and execs the command. It never returns.
func runChild() {
	// A raw fd, not an *os.File whose finalizer could close it before the exec.
	unix.CloseOnExec(statusFD)
	err := setupAndExec()
	code := exitSetup
	var ce *childError
	if errors.As(err, &ce) {
		code = ce.code
	}
	b, _ := json.Marshal(childStatus{Code: code, Error: err.Error()})
	_, _ = unix.Write(statusFD, b)
	os.Exit(code)
}

func setupAndExec() error {
	planFile := os.NewFile(planFD, "plan")
	var p runPlan
	if err := json.NewDecoder(planFile).Decode(&p); err != nil {
		return fmt.Errorf("failed to read the plan: %w", err)
	}
	planFile.Close()

	// Nothing mounted from here on may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("failed to make mounts private: %w", err)
	}
	newRoot, err := prepareRoot(&p)
	if err != nil {
		return err
	}
	if err := mountSystem(newRoot); err != nil {
		return err
	}
	for _, d := range p.Devices {
		if err := mountOne(newRoot, d); err != nil {
			return err
		}
	}
	for _, m := range p.Mounts {
		if err := mountOne(newRoot, m); err != nil {
			return err
		}
	}
	if p.NoPivot {
		err = moveRoot(newRoot)
	} else if err = enterRoot(newRoot); err != nil {
		// pivot_root cannot leave an initramfs root; runc falls back the same way.
		fmt.Fprintf(os.Stderr, "podsim: warning: %v; moving the root and using chroot instead\n", err)
		err = moveRoot(newRoot)
	}
	if err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return fmt.Errorf("failed to set hostname %q: %w", p.Hostname, err)
	}
	if err := os.MkdirAll(p.WorkingDir, 0o755); err != nil {
		return fmt.Errorf("failed to create working dir %q: %w", p.WorkingDir, err)
	}
	if err := os.Chdir(p.WorkingDir); err != nil {
		return fmt.Errorf("failed to enter working dir %q: %w", p.WorkingDir, err)
	}
	if err := setIdentity(&p); err != nil {
		return err
	}
	argv0, err := lookPath(p.Argv[0], envLookup(p.Env))
	if err != nil {
		return &childError{code: exitNotFound, err: err}
	}
	err = unix.Exec(argv0, p.Argv, p.Env)
	code := exitNoExec
	if errors.Is(err, unix.ENOENT) {
		// The file exists, so its interpreter or dynamic loader does not.
		code = exitNotFound
	}
	return &childError{code: code, err: fmt.Errorf("failed to exec %q: %w", argv0, err)}
}

// prepareRoot returns the folder that becomes "/": an overlay of a tmpfs
// writable layer on the root (as a container's image layers), or, when
// overlayfs is unavailable, the root folder itself bound to the scratch folder.
func prepareRoot(p *runPlan) (string, error) {
	if err := unix.Mount("podsim", p.Scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return "", fmt.Errorf("failed to mount tmpfs on scratch folder %q: %w", p.Scratch, err)
	}
	if p.Overlay {
		merged, err := mountOverlay(p.Root, p.Scratch)
		if err == nil {
			return merged, nil
		}
		fmt.Fprintf(os.Stderr, "podsim: warning: %v; mounting the root folder itself, so mount points are created in it\n", err)
	}
	target := filepath.Join(p.Scratch, "root")
	if err := os.Mkdir(target, 0o755); err != nil {
		return "", fmt.Errorf("failed to create %q: %w", target, err)
	}
	if err := unix.Mount(p.Root, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return "", fmt.Errorf("failed to bind root %q: %w", p.Root, err)
	}
	return target, nil
}

func mountOverlay(root, scratch string) (string, error) {
	if strings.ContainsAny(root, ",:\\") {
		return "", fmt.Errorf("overlayfs cannot take root %q: its path holds ',', ':' or '\\'", root)
	}
	dirs := map[string]string{}
	for _, d := range []string{"upper", "work", "merged"} {
		dirs[d] = filepath.Join(scratch, d)
		if err := os.Mkdir(dirs[d], 0o755); err != nil {
			return "", fmt.Errorf("failed to create overlay folder %q: %w", dirs[d], err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", root, dirs["upper"], dirs["work"])
	if err := unix.Mount("overlay", dirs["merged"], "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("failed to mount overlayfs on root %q: %w", root, err)
	}
	return dirs["merged"], nil
}

// mountSystem gives the container what every runtime gives it: /proc of its
// own PID namespace, a read-only /sys, and a /dev with only the basic nodes.
func mountSystem(root string) error {
	const base = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	proc, err := mkdirIn(root, "/proc")
	if err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", base, ""); err != nil {
		return fmt.Errorf("failed to mount /proc: %w", err)
	}
	sys, err := mkdirIn(root, "/sys")
	if err != nil {
		return err
	}
	if err := unix.Mount("sysfs", sys, "sysfs", base|unix.MS_RDONLY, ""); err != nil {
		// Without a network namespace of its own, sysfs may refuse a new
		// instance (runc falls back the same way).
		if err := bindMount("/sys", sys, true); err != nil {
			return fmt.Errorf("failed to mount /sys: %w", err)
		}
	}
	dev, err := mkdirIn(root, "/dev")
	if err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID, "mode=0755,size=65536k"); err != nil {
		return fmt.Errorf("failed to mount /dev: %w", err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := mountOne(root, mountSpec{Type: mountBind, Source: "/dev/" + n, Target: "/dev/" + n}); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, link)); err != nil {
			return fmt.Errorf("failed to create /dev/%s: %w", link, err)
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return fmt.Errorf("failed to create /dev/shm: %w", err)
	}
	if err := unix.Mount("shm", shm, "tmpfs", base, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("failed to mount /dev/shm: %w", err)
	}
	return nil
}

func mkdirIn(root, p string) (string, error) {
	dst, err := resolveIn(root, p)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", fmt.Errorf("failed to create %q in the root: %w", p, err)
	}
	return dst, nil
}

// mountOne makes one volume or device mount, creating its mount point inside
// the root (a folder, or an empty file for a file source).
func mountOne(root string, m mountSpec) error {
	dst, err := resolveIn(root, m.Target)
	if err != nil {
		return err
	}
	if m.Type == mountTmpfs {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("failed to create mount point %q: %w", m.Target, err)
		}
		if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("failed to mount emptyDir %q at %q: %w", m.Volume, m.Target, err)
		}
		return nil
	}
	if err := makeMountPoint(dst, m.Dir); err != nil {
		return fmt.Errorf("failed to create mount point %q: %w", m.Target, err)
	}
	if err := bindMount(m.Source, dst, m.ReadOnly); err != nil {
		return fmt.Errorf("failed to mount %q at %q: %w", m.Source, m.Target, err)
	}
	return nil
}

func makeMountPoint(dst string, dir bool) error {
	fi, err := os.Lstat(dst)
	switch {
	case err == nil && dir != fi.IsDir():
		return fmt.Errorf("%q exists and is not a %s", dst, map[bool]string{true: "folder", false: "file"}[dir])
	case err == nil:
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	case dir:
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// bindMount binds src at dst, recursively as the kubelet does, and for a
// read-only mount remounts it read-only: a bind ignores MS_RDONLY on the first
// call. The remount keeps the source's nosuid/nodev/noexec flags, which the
// kernel refuses to clear on a bind.
func bindMount(src, dst string, readOnly bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("failed to bind: %w", err)
	}
	if !readOnly {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dst, &st); err != nil {
		return fmt.Errorf("failed to statfs: %w", err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for stFlag, msFlag := range map[int64]uintptr{
		unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
		unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	} {
		if st.Flags&stFlag != 0 {
			flags |= msFlag
		}
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("failed to remount read-only: %w", err)
	}
	return nil
}

// enterRoot makes root the process's "/" with pivot_root, so the host's
// filesystem is detached, not merely out of reach as after chroot.
func enterRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("failed to enter root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("failed to pivot_root into %q: %w", root, err)
	}
	// The old root is now stacked under the new one at "/": detach it.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("failed to detach the host root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("failed to enter /: %w", err)
	}
	return nil
}

// moveRoot moves the new root over "/" and chroots into it, as runc's
// --no-pivot does: the host's filesystem stays mounted underneath, out of
// reach of a process without CAP_SYS_CHROOT tricks.
func moveRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("failed to enter root: %w", err)
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("failed to move root %q over /: %w", root, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("failed to chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("failed to enter /: %w", err)
	}
	return nil
}

func setIdentity(p *runPlan) error {
	if p.UID == nil && p.GID == nil {
		return nil
	}
	groups := make([]int, 0, len(p.Groups))
	for _, g := range p.Groups {
		groups = append(groups, int(g))
	}
	// The syscall package applies these to every thread of the process.
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("failed to set supplemental groups: %w", err)
	}
	if p.GID != nil {
		if err := syscall.Setresgid(int(*p.GID), int(*p.GID), int(*p.GID)); err != nil {
			return fmt.Errorf("failed to set group %d: %w", *p.GID, err)
		}
	}
	if p.UID != nil {
		if err := syscall.Setresuid(int(*p.UID), int(*p.UID), int(*p.UID)); err != nil {
			return fmt.Errorf("failed to set user %d: %w", *p.UID, err)
		}
	}
	return nil
}

// lookPath finds the command in the container's PATH, inside the new root,
// as container runtimes do.
func lookPath(name string, lookup func(string) (string, bool)) (string, error) {
	if strings.Contains(name, "/") {
		if _, err := os.Stat(name); err != nil {
			return "", fmt.Errorf("command %q not found in the container: %w", name, err)
		}
		return name, nil
	}
	pathEnv, _ := lookup("PATH")
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		cand := path.Join(dir, name)
		fi, err := os.Stat(cand)
		if err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the container's PATH %q", name, pathEnv)
}
