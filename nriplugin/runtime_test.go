package nriplugin

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/hack/testfixtures/workload"
	"github.com/gpu-injector/gpu-injector/internal/nodeagent"
	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// startRuntime is the runtime side of NRI as containerd 2.2+ runs it with
// the default validator on: the adaptation library containerd and CRI-O
// link, listening on sock.
func startRuntime(t *testing.T, sock string) *adaptation.Adaptation {
	t.Helper()
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("containerd", "v2.2.0", syncFn, update,
		adaptation.WithPluginPath(t.TempDir()), adaptation.WithPluginConfigPath(t.TempDir()),
		adaptation.WithSocketPath(sock),
		adaptation.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// runtimeProcess is a runtime the test can kill: the plugin connects to
// sock, which is forwarded to the NRI adaptation behind it. The adaptation's
// Stop leaves external plugins connected; a runtime that exits closes their
// connections, which kill does.
type runtimeProcess struct {
	r     *adaptation.Adaptation
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func startRuntimeProcess(t *testing.T, sock string) *runtimeProcess {
	t.Helper()
	inner := filepath.Join(t.TempDir(), "nri.sock")
	p := &runtimeProcess{r: startRuntime(t, inner)}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("unix", inner)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			go func() { _, _ = io.Copy(c, b); c.Close() }()
		}
	}()
	return p
}

func (p *runtimeProcess) kill() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.r.Stop()
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAgainstTheRuntime registers the plugin with NRI's runtime side over a
// real socket: a marked GPU container gets the plan's mounts; the webhook's
// required-plugins annotation keeps a container from being created while
// the plugin is away; the plugin says so in its file, and comes back after
// the runtime restarts.
func TestAgainstTheRuntime(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nri.sock")
	dir := t.TempDir()
	plan := workload.LooseFilePlan("570.133.20")
	if err := statedir.WriteLayout(dir, &plan, statedir.NoLayout{}); err != nil {
		t.Fatal(err)
	}
	marked := pod("main")
	marked.Annotations[layout.AnnotationNRIRequiredPlugins+"/container.main"] = `["` + layout.NRIPluginName + `"]`
	create := func(r *adaptation.Adaptation) (*api.CreateContainerResponse, error) {
		return r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: marked, Container: gpuContainer("main")})
	}

	rp := startRuntimeProcess(t, sock)
	r := rp.r
	if _, err := create(r); err == nil || !strings.Contains(err.Error(), layout.NRIPluginName) {
		t.Fatalf("without the plugin: %v, want the validator's refusal naming %s", err, layout.NRIPluginName)
	}

	m := newMetrics()
	s := &server{opts: &Options{Socket: sock, StateDir: dir, PluginIndex: "50", HealthAddr: "0", MetricsAddr: "0"},
		log: nodeagent.NewLogger(io.Discard, 0), metrics: m,
		plugin: &Plugin{StateDir: dir, Rules: config.Default().Rules(), Log: nodeagent.NewLogger(io.Discard, 0), Count: m.count, RecursiveReadOnly: true}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	registered := func() bool {
		p, err := statedir.ReadPlugin(dir)
		return err == nil && p.Registered(time.Now())
	}
	waitFor(t, "the plugin's registration", registered)
	rec, _ := statedir.ReadPlugin(dir)
	if rec.RuntimeName != "containerd" || rec.RuntimeVersion != "v2.2.0" || rec.Protocol != layout.NRIProtocol {
		t.Errorf("plugin record %+v", rec)
	}

	health := httptest.NewServer(s.healthMux())
	defer health.Close()
	readyz := func() int {
		resp, err := http.Get(health.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if readyz() != http.StatusOK || value(t, m.registered) != 1 {
		t.Error("registered, but not ready or not counted so")
	}

	resp, err := createRegistered(t, create, r)
	if err != nil {
		t.Fatalf("with the plugin: %v", err)
	}
	if got := resp.GetAdjust().GetMounts(); !reflect.DeepEqual(got, wantMounts(plan)) {
		t.Errorf("mounts through the runtime\n%v\nwant\n%v", got, wantMounts(plan))
	}
	if got, want := resp.GetAdjust().GetEnv(), []*api.KeyValue{{Key: "LD_LIBRARY_PATH", Value: "/usr/local/nvidia/lib64"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("environment through the runtime %v, want %v", got, want)
	}
	if _, err := r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod(""), Container: gpuContainer("main")}); err != nil {
		t.Errorf("an unmarked container: %v", err)
	}

	// The runtime stops: the plugin's file goes, and the probe drops the label.
	rp.kill()
	waitFor(t, "the plugin file to go", func() bool { p, _ := statedir.ReadPlugin(dir); return p == nil })
	if readyz() != http.StatusServiceUnavailable || value(t, m.registered) != 0 {
		t.Error("still ready after the runtime stopped")
	}
	rp = startRuntimeProcess(t, sock)
	defer rp.kill()
	r = rp.r
	waitFor(t, "the plugin to register again", registered)
	if _, err := createRegistered(t, create, r); err != nil {
		t.Errorf("after the runtime restarted: %v", err)
	}

	if got := value(t, m.byResult[ResultInjected]); got != 2 {
		t.Errorf("%v injections counted, want 2", got)
	}
	if got := value(t, m.byResult[ResultUnmarked]); got != 1 {
		t.Errorf("%v unmarked containers counted, want 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run = %v", err)
	}
	if p, _ := statedir.ReadPlugin(dir); p != nil {
		t.Error("the plugin file outlived the plugin")
	}
}

// value reads a counter's or a gauge's value.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.GetGauge().GetValue()
}

// createRegistered creates the container once the runtime counts the plugin
// in: it does so as the plugin's answer to Synchronize reaches it, just
// after the plugin wrote its file.
func createRegistered(t *testing.T, create func(*adaptation.Adaptation) (*api.CreateContainerResponse, error), r *adaptation.Adaptation) (*api.CreateContainerResponse, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := create(r)
		if err == nil || !strings.Contains(err.Error(), "not present") || time.Now().After(deadline) {
			return resp, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
