// Command nricost measures what gpu-injector's NRI plugin costs on a node:
// its resident memory once registered and after many container creations,
// and the time of one CreateContainer through NRI's runtime side (the
// adaptation library containerd and CRI-O link), with a plan of 19 loose
// driver files. The numbers go to docs/runtime-injection.md.
//
//	go run ./hack/nricost -n 20000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "nricost: %v\n", err)
		os.Exit(1)
	}
}

// quiet keeps the runtime side's log out of the report.
type quiet struct{}

func (quiet) Debugf(context.Context, string, ...any) {}
func (quiet) Infof(context.Context, string, ...any)  {}
func (quiet) Warnf(context.Context, string, ...any)  {}
func (quiet) Errorf(context.Context, string, ...any) {}

func run() error {
	bin := flag.String("bin", "", "gpu-injector binary; empty builds one")
	n := flag.Int("n", 20000, "container creations to send")
	flag.Parse()
	nrilog.Set(quiet{})
	dir, err := os.MkdirTemp("", "nricost")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "gpu-injector")
		build := exec.Command("go", "build", "-trimpath", "-o", *bin, ".")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("failed to build gpu-injector: %w", err)
		}
	}
	sock, state, plugins := filepath.Join(dir, "nri.sock"), filepath.Join(dir, "state"), filepath.Join(dir, "plugins")
	for _, d := range []string{state, plugins} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	plan := workload.LooseFilePlan("570.133.20")
	if err := statedir.WriteLayout(state, &plan, statedir.NoLayout{}); err != nil {
		return err
	}
	r, err := adaptation.New("containerd", "v2.2.0",
		func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, nil, nil); return err },
		func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
			return nil, nil
		},
		adaptation.WithPluginPath(plugins), adaptation.WithPluginConfigPath(plugins), adaptation.WithSocketPath(sock))
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	defer r.Stop()
	cmd := exec.Command(*bin, "nri-plugin", "--socket", sock, "--state-dir", state,
		"--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0")
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p, _ := statedir.ReadPlugin(state); p != nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the plugin did not register within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	fmt.Printf("registered, idle:  %s\n", memory(cmd.Process.Pid))
	pod := &api.PodSandbox{Name: "train", Namespace: "ml", Annotations: map[string]string{layout.AnnotationRuntimeInject: "main"}}
	start := time.Now()
	for range *n {
		// The runtime side applies the adjustment to the container it is
		// given: each creation needs a container of its own.
		ctr := &api.Container{Name: "main", Linux: &api.LinuxContainer{Devices: []*api.LinuxDevice{{Path: "/dev/nvidia0"}}}}
		resp, err := r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
		if err != nil {
			return err
		}
		if got := len(resp.GetAdjust().GetMounts()); got != len(plan.Mounts) {
			return fmt.Errorf("%d mounts injected, want %d", got, len(plan.Mounts))
		}
	}
	fmt.Printf("%d creations of a marked GPU container through NRI: %s each (the runtime side's work and the socket round trip included)\n",
		*n, (time.Since(start) / time.Duration(*n)).Round(time.Microsecond))
	fmt.Printf("after them:        %s\n", memory(cmd.Process.Pid))
	return nil
}

// memory reads the process's resident memory and its parts: anonymous
// (heap, stacks) is the plugin's own; file and shmem are the pages of the
// binary's file it has mapped, shared with the probe's container, which runs
// the same file, and reclaimable.
func memory(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"VmRSS", "RssAnon", "RssFile", "RssShmem"} {
			if strings.HasPrefix(l, k+":") {
				out = append(out, k+" "+strings.Join(strings.Fields(l)[1:], " "))
			}
		}
	}
	return strings.Join(out, ", ")
}
