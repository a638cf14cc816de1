package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one command the launcher started and must stop.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	err     error
}

// startProcess runs bin with args, stdout and stderr into logsDir/name.log. The
// child gets its own process group so a Ctrl-C on the launcher's terminal reaches
// the launcher only, which then stops children in order.
func startProcess(logsDir, name, bin string, args []string, env []string) (*process, error) {
	logPath := filepath.Join(logsDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("failed to open log of %s: %w", name, err)
	}
	fmt.Fprintf(f, "# %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("failed to start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.err == nil {
			return true, fmt.Errorf("%s exited", p.name)
		}
		return true, fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return false, nil
	}
}

// stop sends SIGTERM, then SIGKILL once grace is over, and waits for the exit.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// logTail returns the last lines of the process log, for error messages.
func (p *process) logTail(lines int) string {
	return tailFile(p.logPath, lines)
}

func tailFile(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	parts := bytes.Split(data, []byte("\n"))
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return string(bytes.Join(parts, []byte("\n")))
}

// withLog wraps err with the tail of p's log, so a failure explains itself.
func withLog(err error, p *process) error {
	if p == nil {
		return err
	}
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath, p.logTail(30))
}

// mountNamespace returns the mount namespace identity of pid ("mnt:[4026532]").
func mountNamespace(pid int) (string, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return "", fmt.Errorf("failed to read mount namespace of %d: %w", pid, err)
	}
	return ns, nil
}

// pinNamespace opens pid's mount namespace and returns it with its identity.
// While the file is open the namespace lives on, even once every process in
// it is gone, and so does its number: the kernel hands a freed namespace's
// number to the next namespace made (four unshares in a row get the same
// one), so a sweep by number after the namespace is gone would kill the
// processes of a cluster started meanwhile beside this one.
func pinNamespace(pid int) (*os.File, string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return nil, "", fmt.Errorf("failed to open the mount namespace of %d: %w", pid, err)
	}
	// The identity of what was opened, not of whatever pid is by now.
	ns, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		f.Close()
		return nil, "", fmt.Errorf("failed to read the mount namespace of %d: %w", pid, err)
	}
	return f, ns, nil
}

// procEntry is what the cleanup needs to know of a running process.
type procEntry struct {
	pid, ppid int
	mntNS     string
}

func listProcesses() ([]procEntry, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("failed to list /proc: %w", err)
	}
	var out []procEntry
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name may hold spaces and parentheses; fields after the
		// last ')' are fixed: state, ppid, ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		out = append(out, procEntry{pid: pid, ppid: ppid, mntNS: ns})
	}
	return out, nil
}

// namespaceProcesses returns every process in mount namespace ns and all their
// descendants (containers run in namespaces of their own, below a shim that
// lives in ns). Only processes of the cluster's private namespace match, never
// another user's.
func namespaceProcesses(ns string) ([]int, error) {
	if ns == "" {
		return nil, nil
	}
	procs, err := listProcesses()
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	var roots []int
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		if p.mntNS == ns {
			roots = append(roots, p.pid)
		}
	}
	seen := map[int]bool{}
	var out []int
	var walk func(int)
	walk = func(pid int) {
		if seen[pid] || pid == os.Getpid() {
			return
		}
		seen[pid] = true
		out = append(out, pid)
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out, nil
}

// killAll SIGKILLs pids and waits until they are gone or the deadline passes.
func killAll(pids []int, deadline time.Duration) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("failed to kill %d: %w", pid, err)
		}
	}
	end := time.Now().Add(deadline)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(end) {
				return fmt.Errorf("process %d still alive after SIGKILL", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// alive reports whether pid still runs (zombies count as gone: the kernel has
// released what they held but their parent's wait).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}
