package cluster

import (
	"os"
	"os/exec"
	"testing"
)

// TestPinnedNamespaceKeepsItsNumber: once a mount namespace's last process
// is gone the kernel gives its number to the next namespace made, so a
// cluster sweeping "its" namespace by number after that would kill another
// cluster's processes (seen: a suite's containerd SIGKILLed while the
// package's own test cluster stopped beside it). A pinned namespace keeps
// its number until the pin is closed.
func TestPinnedNamespaceKeepsItsNumber(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a mount namespace needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare (util-linux) is missing")
	}
	// holder starts a process in a new mount namespace and returns it.
	holder := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(unshare, "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", "echo; exec sleep 60")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The line comes once the shell runs in the new namespace.
		if _, err := out.Read(make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	end := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}

	// Unpinned, the number is free again at once (on the kernels seen).
	a := holder()
	nsA, err := mountNamespace(a.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	end(a)
	b := holder()
	nsB, err := mountNamespace(b.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	end(b)
	t.Logf("unpinned: %s, then %s", nsA, nsB)

	c := holder()
	pin, nsC, err := pinNamespace(c.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	if want, _ := mountNamespace(c.Process.Pid); nsC != want {
		t.Fatalf("pinNamespace says %s, the process is in %s", nsC, want)
	}
	end(c)
	d := holder()
	nsD, err := mountNamespace(d.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if nsD == nsC {
		t.Errorf("a namespace made while %s was pinned got its number", nsC)
	}
	left, err := namespaceProcesses(nsC)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("a sweep of the pinned, empty namespace %s finds %v", nsC, left)
	}
}
