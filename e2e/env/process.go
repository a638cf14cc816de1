package env

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one program the environment runs on this machine (the webhook, a
// probe). With restart set it is supervised like a DaemonSet pod: when it
// exits on its own it is started again, which is how a probe picks up a new
// NVML library after a driver upgrade.
type proc struct {
	name    string
	bin     string
	args    []string
	logPath string
	restart bool

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	err      error
	stopping bool
	restarts int
	// supervised is closed when the supervisor goroutine has returned.
	supervised chan struct{}
}

func newProc(name, bin, logPath string, restart bool, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, logPath: logPath, restart: restart}
}

// start runs the program; its stdout and stderr are appended to logPath.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.startLocked(); err != nil {
		return err
	}
	p.stopping = false
	p.supervised = make(chan struct{})
	go p.supervise(p.supervised)
	return nil
}

func (p *proc) startLocked() error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("failed to open log of %s: %w", p.name, err)
	}
	fmt.Fprintf(f, "# %s %s %s\n", time.Now().Format(time.RFC3339), p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout = f
	cmd.Stderr = f
	// Its own process group, so a Ctrl-C on the terminal reaches only the
	// environment, which then stops everything in order; killed with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("failed to start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.err = cmd, done, nil
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func (p *proc) supervise(finished chan struct{}) {
	defer close(finished)
	for {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		<-done
		p.mu.Lock()
		if p.stopping || !p.restart {
			p.mu.Unlock()
			return
		}
		p.restarts++
		p.mu.Unlock()
		// A crash loop must not spin: one second, as a kubelet's first back-off.
		time.Sleep(time.Second)
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		err := p.startLocked()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// pid is the current process's ID, 0 when none runs.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// exited reports whether the current process has ended (and is not being
// restarted), with its exit error.
func (p *proc) exited() (bool, error) {
	p.mu.Lock()
	done, restart, stopping := p.done, p.restart, p.stopping
	p.mu.Unlock()
	if done == nil {
		return true, fmt.Errorf("%s never started", p.name)
	}
	select {
	case <-done:
		if restart && !stopping {
			return false, nil
		}
		p.mu.Lock()
		err := p.err
		p.mu.Unlock()
		if err == nil {
			return true, fmt.Errorf("%s exited", p.name)
		}
		return true, fmt.Errorf("%s exited: %w", p.name, err)
	default:
		return false, nil
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("failed to signal %s: not running", p.name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("failed to signal %s: %w", p.name, err)
	}
	return nil
}

// Restarts counts the times the supervisor started the program again.
func (p *proc) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// stop sends SIGTERM, then SIGKILL after grace, by PID, and waits for the
// process and its supervisor. Safe to call when it is not running.
func (p *proc) stop(grace time.Duration) error {
	p.mu.Lock()
	p.stopping = true
	cmd, done, supervised := p.cmd, p.done, p.supervised
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
	default:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, cmd.Process.Pid)
			}
		}
	}
	if supervised != nil {
		<-supervised
	}
	// The supervisor may have started a new process between our read of cmd
	// and its exit; stop that one too.
	p.mu.Lock()
	again := p.cmd != cmd
	p.mu.Unlock()
	if again {
		return p.stop(grace)
	}
	return nil
}

// tail returns the last lines of the log, for error messages.
func (p *proc) tail(lines int) string {
	return tailFile(p.logPath, lines)
}

func tailFile(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	parts := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

func withLog(err error, p *proc) error {
	if err == nil || p == nil {
		return err
	}
	return fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath, p.tail(30))
}
