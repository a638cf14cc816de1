// Command runccaps is the runc that the test cluster's CRI-O runs: it cuts
// the capabilities of the container it creates (or of the process it execs)
// to those it holds in its own bounding set, then execs the real runc with
// the same arguments.
//
// CRI-O gives a privileged container every capability the kernel knows;
// containerd gives the capabilities it holds itself. Where the launcher's
// root lacks one in its bounding set (CAP_SYS_RESOURCE on this project's
// development machines), runc cannot grant it and refuses the container
// ("unable to apply caps: ... operation not permitted"): NVIDIA's device
// plugin's privileged container never starts. This gives CRI-O containerd's
// behaviour, and only in the test cluster; a real node's CRI-O runs runc
// directly.
package main

import (
	"fmt"
	"os"
	"syscall"
)

// runc is the real runc, set at build time (-ldflags -X main.runc=...).
var runc string

func main() {
	if runc == "" {
		fmt.Fprintln(os.Stderr, "runccaps: built without the real runc's path (-X main.runc)")
		os.Exit(1)
	}
	if err := restrict(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "runccaps: %v\n", err)
		os.Exit(1)
	}
	err := syscall.Exec(runc, append([]string{runc}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "runccaps: failed to exec %s: %v\n", runc, err)
	os.Exit(1)
}

func restrict(args []string) error {
	file := specFile(args)
	if file == "" {
		return nil
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("failed to read this process's status: %w", err)
	}
	bounding, err := boundingSet(string(status))
	if err != nil {
		return err
	}
	return restrictFile(file, bounding)
}
