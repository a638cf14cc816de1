//go:build unix

package credprovider

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// stopGroup makes the plugin lead a process group of its own, and its stop
// (timeout, too long an answer) kill the whole group: a child the plugin
// started dies with it, rather than run on in the webhook's container
// holding the plugin's output pipe.
func stopGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
}
