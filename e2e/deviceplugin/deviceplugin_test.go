package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	testInterval = 20 * time.Millisecond
	deadline     = 10 * time.Second
)

// fakeKubelet is the kubelet's registration service on a real unix socket.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	server   *grpc.Server
	requests chan *pluginapi.RegisterRequest
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	k := &fakeKubelet{server: grpc.NewServer(), requests: make(chan *pluginapi.RegisterRequest, 10)}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(lis)
	t.Cleanup(k.server.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if req.Version != pluginapi.Version {
		return nil, status.Errorf(codes.InvalidArgument, "unsupported version %q", req.Version)
	}
	k.requests <- req
	return &pluginapi.Empty{}, nil
}

// restart does what a kubelet restart does to the folder: its socket goes
// away, every plugin socket is deleted, and a new kubelet.sock appears.
func (k *fakeKubelet) restart(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k.server.Stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
			t.Fatalf("remove: %v", err)
		}
	}
	return startKubelet(t, dir)
}

func (k *fakeKubelet) waitRegister(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case req := <-k.requests:
		return req
	case <-time.After(deadline):
		t.Fatal("the plugin did not register")
		return nil
	}
}

// shortDir keeps socket paths under the 108-byte unix socket limit.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startPlugin(t *testing.T, dir, resource string, count int) (cancel func(), done chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t)))
	done = make(chan error, 1)
	go func() { done <- serve(ctx, dir, resource, count, testInterval) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return cancel, done
}

func dialPlugin(t *testing.T, dir string, req *pluginapi.RegisterRequest) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial plugin: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func listDevices(t *testing.T, c pluginapi.DevicePluginClient) []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatalf("ListAndWatch: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch receive: %v", err)
	}
	return resp.Devices
}

func TestServe(t *testing.T) {
	dir := shortDir(t)
	kubelet := startKubelet(t, dir)
	startPlugin(t, dir, "nvidia.com/gpu", 3)

	req := kubelet.waitRegister(t)
	want := &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: "fake-nvidia-com-gpu.sock", ResourceName: "nvidia.com/gpu",
		Options: &pluginapi.DevicePluginOptions{},
	}
	if !proto.Equal(req, want) {
		t.Fatalf("register request %v, want %v", req, want)
	}
	client := dialPlugin(t, dir, req)

	devices := listDevices(t, client)
	var ids []string
	for _, d := range devices {
		ids = append(ids, d.ID)
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s", d.ID, d.Health)
		}
	}
	if !slices.Equal(ids, []string{"stand-in-0", "stand-in-1", "stand-in-2"}) {
		t.Errorf("devices %v", ids)
	}

	tests := map[string]struct {
		containers [][]string
		wantEnvs   []string
		wantCode   codes.Code
	}{
		"one device":          {containers: [][]string{{"stand-in-1"}}, wantEnvs: []string{"stand-in-1"}},
		"two devices":         {containers: [][]string{{"stand-in-0", "stand-in-2"}}, wantEnvs: []string{"stand-in-0,stand-in-2"}},
		"two containers":      {containers: [][]string{{"stand-in-0"}, {"stand-in-1"}}, wantEnvs: []string{"stand-in-0", "stand-in-1"}},
		"unknown device":      {containers: [][]string{{"stand-in-0", "GPU-1234"}}, wantCode: codes.InvalidArgument},
		"one past the last":   {containers: [][]string{{"stand-in-3"}}, wantCode: codes.InvalidArgument},
		"no container at all": {containers: nil, wantEnvs: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			areq := &pluginapi.AllocateRequest{}
			for _, ids := range tc.containers {
				areq.ContainerRequests = append(areq.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := client.Allocate(context.Background(), areq)
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode {
					t.Fatalf("Allocate error %v, want code %v", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if len(resp.ContainerResponses) != len(tc.wantEnvs) {
				t.Fatalf("%d container responses, want %d", len(resp.ContainerResponses), len(tc.wantEnvs))
			}
			for i, c := range resp.ContainerResponses {
				if got := c.Envs[VisibleDevicesEnv]; got != tc.wantEnvs[i] || len(c.Envs) != 1 {
					t.Errorf("container %d envs %v, want only %s=%s", i, c.Envs, VisibleDevicesEnv, tc.wantEnvs[i])
				}
				if len(c.Devices) != 0 || len(c.Mounts) != 0 {
					t.Errorf("container %d gets devices %v and mounts %v; the fake plugin must give none", i, c.Devices, c.Mounts)
				}
			}
		})
	}
}

func TestServeReregistersAfterKubeletRestart(t *testing.T) {
	dir := shortDir(t)
	kubelet := startKubelet(t, dir)
	startPlugin(t, dir, "nvidia.com/gpu", 2)
	req := kubelet.waitRegister(t)

	kubelet = kubelet.restart(t, dir)
	again := kubelet.waitRegister(t)
	if !proto.Equal(req, again) {
		t.Errorf("second registration %v differs from the first %v", again, req)
	}
	// The kubelet deleted the plugin's socket; a new one must answer.
	if got := len(listDevices(t, dialPlugin(t, dir, again))); got != 2 {
		t.Errorf("%d devices after the restart, want 2", got)
	}
	select {
	case extra := <-kubelet.requests:
		t.Errorf("registered twice with the same kubelet: %v", extra)
	case <-time.After(10 * testInterval):
	}
}

func TestServeWaitsForKubelet(t *testing.T) {
	dir := shortDir(t)
	startPlugin(t, dir, "example.com/widget", 1)
	socket := filepath.Join(dir, SocketName("example.com/widget"))
	waitFor(t, func() bool { _, err := os.Stat(socket); return err == nil })
	kubelet := startKubelet(t, dir)
	if req := kubelet.waitRegister(t); req.ResourceName != "example.com/widget" || req.Endpoint != "fake-example-com-widget.sock" {
		t.Errorf("register request %v", req)
	}
}

func TestServeStops(t *testing.T) {
	dir := shortDir(t)
	kubelet := startKubelet(t, dir)
	cancel, done := startPlugin(t, dir, "nvidia.com/gpu", 1)
	req := kubelet.waitRegister(t)
	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup in startPlugin
		if err != nil {
			t.Fatalf("Serve returned %v after cancel, want nil", err)
		}
	case <-time.After(deadline):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := os.Stat(filepath.Join(dir, req.Endpoint)); !os.IsNotExist(err) {
		t.Errorf("plugin socket left behind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet.sock")); err != nil {
		t.Errorf("the plugin removed the kubelet's socket: %v", err)
	}
}

func TestServeInvalid(t *testing.T) {
	tests := map[string]struct {
		dir      string
		resource string
		count    int
		want     string
	}{
		"no domain":     {dir: "/tmp", resource: "gpu", count: 1, want: "invalid resource name"},
		"bad character": {dir: "/tmp", resource: "nvidia.com/g pu", count: 1, want: "invalid resource name"},
		"zero devices":  {dir: "/tmp", resource: "nvidia.com/gpu", count: 0, want: "invalid device count"},
		"relative dir":  {dir: "plugins", resource: "nvidia.com/gpu", count: 1, want: "not an absolute path"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Serve(context.Background(), tc.dir, tc.resource, tc.count)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve error %v, want %q", err, tc.want)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatal("condition not met before the deadline")
		}
		time.Sleep(testInterval)
	}
}

// fakeDev is a folder of stand-in device nodes: links to /dev/null, a real
// character device, so no mknod (and no root) is needed.
func fakeDev(t *testing.T, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range nodes {
		if err := os.Symlink("/dev/null", filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestHostDevices(t *testing.T) {
	dev := fakeDev(t, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps", "nvidia01x", "nvidia-modeset-not")
	// A regular file named like a GPU is not one.
	if err := os.WriteFile(filepath.Join(dev, "nvidia7"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	devices, err := HostDevices(dev)
	if err != nil {
		t.Fatalf("HostDevices: %v", err)
	}
	var got []string
	for _, d := range devices {
		var paths []string
		for _, s := range d.Specs {
			if s.HostPath != filepath.Join(dev, filepath.Base(s.ContainerPath)) || s.Permissions != "rw" {
				t.Errorf("device %s: spec %v", d.ID, s)
			}
			paths = append(paths, s.ContainerPath)
		}
		got = append(got, d.ID+"="+strings.Join(paths, ","))
	}
	want := []string{
		"nvidia0=/dev/nvidia0,/dev/nvidiactl,/dev/nvidia-uvm,/dev/nvidia-uvm-tools",
		"nvidia1=/dev/nvidia1,/dev/nvidiactl,/dev/nvidia-uvm,/dev/nvidia-uvm-tools",
	}
	if !slices.Equal(got, want) {
		t.Errorf("devices\n%v\nwant\n%v", got, want)
	}

	for name, nodes := range map[string][]string{
		"no driver":     {"nvidia0"},
		"no GPU node":   {"nvidiactl", "nvidia-uvm"},
		"empty machine": nil,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := HostDevices(fakeDev(t, nodes...)); err == nil {
				t.Errorf("HostDevices of %v succeeded, want an error", nodes)
			}
		})
	}
}

func TestServeHostDevicesAllocate(t *testing.T) {
	devices, err := HostDevices(fakeDev(t, "nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"))
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	kubelet := startKubelet(t, dir)
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() { done <- serveHostDevices(ctx, dir, "nvidia.com/gpu", devices, testInterval) }()
	t.Cleanup(func() { cancel(); <-done })
	client := dialPlugin(t, dir, kubelet.waitRegister(t))

	var ids []string
	for _, d := range listDevices(t, client) {
		ids = append(ids, d.ID)
	}
	if !slices.Equal(ids, []string{"nvidia0", "nvidia1"}) {
		t.Errorf("devices %v", ids)
	}
	tests := map[string]struct {
		ids  []string
		want []string
	}{
		"one GPU":  {ids: []string{"nvidia1"}, want: []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}},
		"two GPUs": {ids: []string{"nvidia0", "nvidia1"}, want: []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tc.ids}},
			})
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			c := resp.ContainerResponses[0]
			var paths []string
			for _, d := range c.Devices {
				paths = append(paths, d.ContainerPath)
			}
			if !slices.Equal(paths, tc.want) {
				t.Errorf("devices %v, want %v", paths, tc.want)
			}
			if c.Envs[VisibleDevicesEnv] != strings.Join(tc.ids, ",") || len(c.Mounts) != 0 {
				t.Errorf("envs %v mounts %v: want only %s and no mount (the driver is gpu-injector's)", c.Envs, c.Mounts, VisibleDevicesEnv)
			}
		})
	}
	if _, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nvidia2"}}},
	}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of an unknown GPU: %v, want InvalidArgument", err)
	}
}
