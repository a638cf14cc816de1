//go:build linux

// Command podsim runs one container of a (mutated) Pod the way a kubelet and
// a container runtime would, as far as the NVIDIA driver is concerned: in new
// mount, PID, UTS and IPC namespaces, with a given folder as its root, the
// pod's hostPath volumes bind-mounted as the pod says (read-only when it says
// so), emptyDirs as tmpfs, /proc, /sys, a minimal /dev, the host's
// /dev/nvidia* nodes (what the NVIDIA device plugin provides in a cluster),
// and only the container's environment. It proves on a machine without a
// container runtime that what gpu-injector injects is all a driverless image
// needs. Linux only; run as root.
//
//	podsim -f job.mutated.yaml [--pod NAME] [--container NAME] --root DIR [-- COMMAND ARG...]
//
// A COMMAND after "--" replaces the container's command and args, as
// `kubectl debug` or `docker run IMAGE CMD` would: the same mounts and env,
// another program (nvidia-smi -L instead of nvidia-smi, say).
//
// The exit code is the container's; 125 means podsim itself failed, 126 the
// command could not be executed, 127 the command was not found.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Exit codes of podsim's own failures, as docker run uses them.
const (
	exitSetup    = 125
	exitNoExec   = 126
	exitNotFound = 127
)

// childMarker in the environment makes the re-executed podsim the container's init.
const childMarker = "PODSIM_CHILD"

// File descriptors the parent hands to the child: the plan to read, and a
// close-on-exec status pipe that stays empty when the exec succeeds.
const (
	planFD   = 3
	statusFD = 4
)

// childStatus is what the child reports when it fails before the exec.
type childStatus struct {
	Code  int    `json:"code"`
	Error string `json:"error"`
}

func main() {
	if os.Getenv(childMarker) == "1" {
		runChild()
		return
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("podsim", flag.ContinueOnError)
	fl.SetOutput(stderr)
	file := fl.String("f", "", "manifest with the Pod or workload (YAML or JSON, several documents allowed); - for stdin")
	podName := fl.String("pod", "", "name of the Pod or workload to run (default: the first in the manifest)")
	container := fl.String("container", "", "container to run (default: the first)")
	root := fl.String("root", "", "folder to use as the container's root filesystem (required)")
	overlay := fl.Bool("overlay", true, "give the container a tmpfs writable layer over --root, so --root stays untouched; when false (or when overlayfs fails) mount points are created in --root itself")
	gpuDevices := fl.Bool("gpu-devices", true, "bind the host's /dev/nvidia* nodes into /dev, as the NVIDIA device plugin does in a cluster")
	hostDev := fl.String("host-dev", "/dev", "host folder to take the /dev/nvidia* nodes from")
	hostRoot := fl.String("host-root", "/", "folder that stands for the node's /: hostPath volumes are taken under it (for a fake node built in a folder)")
	nodeName := fl.String("node-name", "", "value of spec.nodeName for fieldRef env variables (default: this host's name)")
	noPivot := fl.Bool("no-pivot", false, "enter the root with MS_MOVE and chroot instead of pivot_root (as runc --no-pivot; podsim falls back to it when pivot_root fails)")
	quiet := fl.Bool("q", false, "do not print the header of what is mounted")
	nodeFile := fl.String("node", "", "a Node (YAML or JSON): refuse to run unless the pod's nodeSelector and required node affinity match it, as the scheduler would")
	fl.Usage = func() {
		fmt.Fprintf(stderr, "usage: podsim -f MANIFEST [--pod NAME] [--container NAME] --root DIR [flags] [-- COMMAND ARG...]\n\n")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *file == "" || *root == "" {
		fl.Usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "podsim: %v\n", err)
		return exitSetup
	}

	absRoot, err := checkRoot(*root)
	if err != nil {
		return fail(err)
	}
	if *hostRoot, err = filepath.Abs(*hostRoot); err != nil {
		return fail(fmt.Errorf("failed to resolve host root: %w", err))
	}
	in := stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fail(fmt.Errorf("failed to open manifest: %w", err))
		}
		defer f.Close()
		in = f
	}
	cands, err := readCandidates(in)
	if err != nil {
		return fail(err)
	}
	pod, err := selectCandidate(cands, *podName)
	if err != nil {
		return fail(err)
	}
	c, err := selectContainer(&pod.Spec, *container)
	if err != nil {
		return fail(err)
	}
	if *nodeFile != "" {
		name, err := checkNode(*nodeFile, pod)
		if err != nil {
			return fail(err)
		}
		if !*quiet {
			fmt.Fprintf(stderr, "podsim: node %q matches the pod's nodeSelector %v\n", name, pod.Spec.NodeSelector)
		}
		if *nodeName == "" {
			*nodeName = name
		}
	}
	if *nodeName == "" {
		*nodeName, _ = os.Hostname()
	}
	plan, warnings, err := buildPlan(pod, c, options{Root: absRoot, Overlay: *overlay, GPUDevices: *gpuDevices, HostDev: *hostDev, NodeName: *nodeName, HostRoot: *hostRoot, Argv: fl.Args()})
	if err != nil {
		return fail(err)
	}
	if !*quiet {
		printHeader(stderr, pod, c.Name, plan)
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "podsim: warning: %s\n", w)
	}
	scratch, err := os.MkdirTemp("", "podsim-")
	if err != nil {
		return fail(fmt.Errorf("failed to create a scratch folder: %w", err))
	}
	// The child mounts a tmpfs on it in its own namespace; the host only ever sees an empty folder.
	defer os.Remove(scratch)
	plan.Scratch = scratch
	plan.NoPivot = *noPivot
	code, err := startChild(plan, stdin, stdout, stderr)
	if err != nil {
		return fail(err)
	}
	return code
}

func checkRoot(root string) (string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("failed to resolve root %q: %w", root, err)
	}
	abs, err = filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("failed to resolve root %q: %w", root, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("failed to stat root %q: %w", root, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("root %q is not a folder", root)
	}
	if abs == "/" {
		return "", fmt.Errorf("root must not be the host's /: the point is that nothing of the host leaks in")
	}
	return abs, nil
}

func printHeader(w io.Writer, pod podCandidate, container string, p *runPlan) {
	ns := pod.Namespace
	if ns == "" {
		ns = "default"
	}
	layer := "tmpfs overlay (root stays untouched)"
	if !p.Overlay {
		layer = "the root folder itself"
	}
	fmt.Fprintf(w, "podsim: %s %s/%s container %q, root %s, writable layer: %s\n", pod.Kind, ns, pod.Name, container, p.Root, layer)
	fmt.Fprintf(w, "podsim: mount /proc (proc), /sys (sysfs, ro), /dev (tmpfs: null zero full random urandom tty, shm)\n")
	for _, m := range p.Mounts {
		switch m.Type {
		case mountTmpfs:
			fmt.Fprintf(w, "podsim: mount %s <- emptyDir volume %q (tmpfs)\n", m.Target, m.Volume)
		default:
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			fmt.Fprintf(w, "podsim: mount %s <- hostPath %s (%s, volume %q)\n", m.Target, m.Source, mode, m.Volume)
		}
	}
	if len(p.Devices) > 0 {
		var names []string
		for _, d := range p.Devices {
			names = append(names, d.Target)
		}
		fmt.Fprintf(w, "podsim: devices %s (from the host: in a cluster the NVIDIA device plugin provides them, not gpu-injector)\n", strings.Join(names, " "))
	} else {
		fmt.Fprintf(w, "podsim: devices: none (no /dev/nvidia* on this host, or --gpu-devices=false)\n")
	}
	for _, kv := range p.Env {
		fmt.Fprintf(w, "podsim: env %s\n", kv)
	}
	if p.UID != nil {
		fmt.Fprintf(w, "podsim: user %d\n", *p.UID)
	}
	fmt.Fprintf(w, "podsim: exec %s (cwd %s)\n", strings.Join(p.Argv, " "), p.WorkingDir)
}

// startChild re-executes podsim in new namespaces, hands it the plan, and
// returns the container's exit code.
func startChild(p *runPlan, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	planR, planW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("failed to create the plan pipe: %w", err)
	}
	defer planR.Close()
	defer planW.Close()
	statR, statW, err := os.Pipe()
	if err != nil {
		return 0, fmt.Errorf("failed to create the status pipe: %w", err)
	}
	defer statR.Close()
	defer statW.Close()

	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"podsim-init"}
	cmd.Env = []string{childMarker + "=1"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.ExtraFiles = []*os.File{planR, statW}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		// The container must not outlive podsim; Pdeathsig follows the thread
		// that forked, hence the lock.
		Pdeathsig: syscall.SIGKILL,
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("failed to start the container process (podsim needs root for namespaces and mounts): %w", err)
	}
	planR.Close()
	statW.Close()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()

	werr := json.NewEncoder(planW).Encode(p)
	planW.Close()
	status, rerr := io.ReadAll(statR)
	waitErr := cmd.Wait()
	if werr != nil {
		return 0, fmt.Errorf("failed to send the plan to the container process: %w", werr)
	}
	if rerr != nil {
		return 0, fmt.Errorf("failed to read the container process status: %w", rerr)
	}
	if len(status) > 0 {
		var st childStatus
		if err := json.Unmarshal(status, &st); err != nil {
			return 0, fmt.Errorf("failed to decode the container process status %q: %w", status, err)
		}
		fmt.Fprintf(stderr, "podsim: %s\n", st.Error)
		return st.Code, nil
	}
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) {
		return 0, fmt.Errorf("failed to wait for the container process: %w", waitErr)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return cmd.ProcessState.ExitCode(), nil
}
