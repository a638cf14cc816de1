// Package deviceplugin is a kubelet device plugin for tests: it advertises a
// number of made-up devices of one extended resource (nvidia.com/gpu in the
// end-to-end tests), so the scheduler and the kubelet admit GPU pods on a node
// that has no GPU. Allocate hands out no device node, only the
// NVIDIA_VISIBLE_DEVICES variable that the real NVIDIA plugin sets; what a
// container sees of the driver comes from gpu-injector's mounts alone.
//
// On a machine with a GPU, ServeHostDevices advertises the real device nodes
// instead (/dev/nvidiaN) and hands each allocated container its node plus the
// control nodes every CUDA process opens, as NVIDIA's own plugin does: device
// nodes only, never a driver file, which remains gpu-injector's job.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DeviceIDPrefix starts every device ID, so nobody mistakes one for a GPU UUID.
const DeviceIDPrefix = "stand-in-"

// VisibleDevicesEnv is the variable Allocate sets, as the NVIDIA plugin does.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// kubeletSocket is the kubelet's registration socket inside the plugin folder.
var kubeletSocket = filepath.Base(pluginapi.KubeletSocket)

// checkInterval bounds how long a kubelet restart goes unnoticed.
const checkInterval = 500 * time.Millisecond

// registerTimeout bounds one Register call; the kubelet answers in milliseconds.
const registerTimeout = 5 * time.Second

// DeviceIDs returns the IDs Serve advertises for count devices.
func DeviceIDs(count int) []string {
	ids := make([]string, count)
	for i := range ids {
		ids[i] = DeviceIDPrefix + strconv.Itoa(i)
	}
	return ids
}

// SocketName is the file name of the plugin's socket for a resource, unique
// per resource so two test plugins can share one kubelet.
func SocketName(resource string) string {
	return "fake-" + strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
}

// Serve advertises count healthy devices of resource to the kubelet whose
// device plugin folder is dir (normally /var/lib/kubelet/device-plugins),
// serving the device plugin API on its own socket in that folder. It waits
// for the kubelet's socket if it is not there yet, and registers again
// whenever that socket is recreated (a kubelet restart, which also deletes
// the plugin's socket). It returns nil once ctx is done, with its socket
// removed, or an error for arguments it cannot serve.
func Serve(ctx context.Context, dir, resource string, count int) error {
	return serve(ctx, dir, resource, count, checkInterval)
}

func serve(ctx context.Context, dir, resource string, count int, interval time.Duration) error {
	if count < 1 {
		return fmt.Errorf("invalid device count %d: want at least 1", count)
	}
	return servePlugin(ctx, dir, resource, newPlugin(count), interval)
}

// ServeHostDevices is Serve for real device nodes: it advertises devices
// (from HostDevices) and Allocate hands each container the DeviceSpecs of the
// devices it got.
func ServeHostDevices(ctx context.Context, dir, resource string, devices []HostDevice) error {
	return serveHostDevices(ctx, dir, resource, devices, checkInterval)
}

func serveHostDevices(ctx context.Context, dir, resource string, devices []HostDevice, interval time.Duration) error {
	if len(devices) == 0 {
		return errors.New("invalid device list: no device to advertise")
	}
	return servePlugin(ctx, dir, resource, newHostPlugin(devices), interval)
}

func servePlugin(ctx context.Context, dir, resource string, p *plugin, interval time.Duration) error {
	if errs := validation.IsQualifiedName(resource); len(errs) > 0 || !strings.Contains(resource, "/") {
		return fmt.Errorf("invalid resource name %q: want an extended resource such as nvidia.com/gpu %v", resource, errs)
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("invalid device plugin folder %q: not an absolute path", dir)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("resource", resource)
	s := &state{
		plugin:  p,
		dir:     dir,
		socket:  filepath.Join(dir, SocketName(resource)),
		kubelet: filepath.Join(dir, kubeletSocket),
		request: &pluginapi.RegisterRequest{
			Version:      pluginapi.Version,
			Endpoint:     SocketName(resource),
			ResourceName: resource,
			Options:      &pluginapi.DevicePluginOptions{},
		},
		log: log,
	}
	defer s.stop()

	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			log.Info("stopping device plugin")
			return nil
		case <-ticker.C:
		}
	}
}

// state is what Serve knows of the two sockets; reconcile moves it toward
// "serving on our socket and registered with the kubelet socket now present".
type state struct {
	plugin  *plugin
	dir     string
	socket  string
	kubelet string
	request *pluginapi.RegisterRequest
	log     logr.Logger

	server *grpc.Server
	// served is our socket file as we created it; a different file, or none,
	// at that path means the kubelet cleaned the folder.
	served os.FileInfo
	// registered is the kubelet socket we registered with; nil when not registered.
	registered os.FileInfo
}

func (s *state) reconcile(ctx context.Context) {
	if s.server != nil && !sameFile(s.served, s.socket) {
		s.log.Info("plugin socket is gone, serving again", "socket", s.socket)
		s.stop()
	}
	if s.server == nil {
		if err := s.start(); err != nil {
			s.log.Error(err, "failed to serve the device plugin API", "socket", s.socket)
			return
		}
		s.registered = nil
	}
	kubelet, err := os.Stat(s.kubelet)
	if err != nil {
		if s.registered != nil {
			s.log.Info("kubelet socket is gone, waiting for the kubelet", "socket", s.kubelet)
		}
		s.registered = nil
		return
	}
	if s.registered != nil && os.SameFile(s.registered, kubelet) && s.registered.ModTime().Equal(kubelet.ModTime()) {
		return
	}
	if err := s.register(ctx); err != nil {
		s.log.Error(err, "failed to register with the kubelet, will retry", "socket", s.kubelet)
		return
	}
	s.registered = kubelet
	s.log.Info("registered with the kubelet", "socket", s.kubelet, "devices", len(s.plugin.devices))
}

func sameFile(want os.FileInfo, path string) bool {
	got, err := os.Lstat(path)
	return err == nil && os.SameFile(want, got) && want.ModTime().Equal(got.ModTime())
}

func (s *state) start() error {
	// 0750 as the kubelet creates it; whoever comes first sets the mode.
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return fmt.Errorf("failed to create %q: %w", s.dir, err)
	}
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("failed to remove stale socket %q: %w", s.socket, err)
	}
	lis, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("failed to listen on %q: %w", s.socket, err)
	}
	fi, err := os.Lstat(s.socket)
	if err != nil {
		lis.Close()
		return fmt.Errorf("failed to stat %q: %w", s.socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, s.plugin)
	go func() {
		// Serve returns when stop() is called, or when the listener fails,
		// which reconcile notices as a missing or replaced socket file.
		if err := srv.Serve(lis); err != nil {
			s.log.Error(err, "device plugin server stopped")
		}
	}()
	s.server, s.served = srv, fi
	s.log.V(1).Info("serving the device plugin API", "socket", s.socket)
	return nil
}

func (s *state) stop() {
	if s.server == nil {
		return
	}
	// Stop, not GracefulStop: ListAndWatch streams never end on their own.
	s.server.Stop()
	s.server = nil
	// Only our own file: after a kubelet restart the path may be another's.
	if sameFile(s.served, s.socket) {
		if err := os.Remove(s.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Error(err, "failed to remove plugin socket", "socket", s.socket)
		}
	}
	s.served = nil
}

func (s *state) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+s.kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("failed to connect to %q: %w", s.kubelet, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, s.request); err != nil {
		return fmt.Errorf("failed to register %s: %w", s.request.ResourceName, err)
	}
	return nil
}

// plugin answers the kubelet's calls. Its devices never change.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	known   map[string]bool
	// specs are the device nodes of each device; nil for made-up devices.
	specs map[string][]*pluginapi.DeviceSpec
}

// HostDevice is one GPU's device node and the nodes it cannot work without.
type HostDevice struct {
	// ID is the node's name (nvidia0), which the kubelet records per pod.
	ID string
	// Specs are the nodes a container using this device gets.
	Specs []*pluginapi.DeviceSpec
}

// controlNodes are opened by every CUDA and NVML process besides the GPU's
// own node; nvidia-uvm carries CUDA's unified memory, without it cudaMalloc fails.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

// HostDevices lists the GPUs whose nodes are in devDir (/dev on a GPU machine,
// a folder of stand-in nodes in a rehearsal): one device per nvidiaN, each with
// that node and the control nodes present. The container paths are always
// under /dev, where the driver's libraries look.
func HostDevices(devDir string) ([]HostDevice, error) {
	entries, err := os.ReadDir(devDir)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", devDir, err)
	}
	spec := func(name string) *pluginapi.DeviceSpec {
		return &pluginapi.DeviceSpec{HostPath: filepath.Join(devDir, name), ContainerPath: "/dev/" + name, Permissions: "rw"}
	}
	var control []*pluginapi.DeviceSpec
	for _, name := range controlNodes {
		if isCharDevice(filepath.Join(devDir, name)) {
			control = append(control, spec(name))
		}
	}
	if len(control) == 0 || control[0].ContainerPath != "/dev/nvidiactl" {
		return nil, fmt.Errorf("failed to find %s: no NVIDIA driver loaded on this machine", filepath.Join(devDir, "nvidiactl"))
	}
	var gpus []int
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), "nvidia")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(n)
		if err != nil || strconv.Itoa(i) != n || !isCharDevice(filepath.Join(devDir, e.Name())) {
			continue
		}
		gpus = append(gpus, i)
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("failed to find a GPU device node (nvidia0, ...) in %s", devDir)
	}
	slices.Sort(gpus)
	devices := make([]HostDevice, 0, len(gpus))
	for _, i := range gpus {
		name := "nvidia" + strconv.Itoa(i)
		devices = append(devices, HostDevice{ID: name, Specs: append([]*pluginapi.DeviceSpec{spec(name)}, control...)})
	}
	return devices, nil
}

func isCharDevice(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&fs.ModeCharDevice != 0
}

func newHostPlugin(devices []HostDevice) *plugin {
	p := &plugin{known: map[string]bool{}, specs: map[string][]*pluginapi.DeviceSpec{}}
	for _, d := range devices {
		p.devices = append(p.devices, &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy})
		p.known[d.ID] = true
		p.specs[d.ID] = d.Specs
	}
	return p
}

func newPlugin(count int) *plugin {
	p := &plugin{known: map[string]bool{}}
	for _, id := range DeviceIDs(count) {
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		p.known[id] = true
	}
	return p
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once and holds the stream open: the
// kubelet reads a closed stream as every device gone unhealthy.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return fmt.Errorf("failed to send the device list: %w", err)
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		ids := c.GetDevicesIds()
		for _, id := range ids {
			if !p.known[id] {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
		}
		cr := &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{VisibleDevicesEnv: strings.Join(ids, ",")},
		}
		// Control nodes are shared by every device: each goes in once.
		seen := map[string]bool{}
		for _, id := range ids {
			for _, s := range p.specs[id] {
				if !seen[s.ContainerPath] {
					seen[s.ContainerPath] = true
					cr.Devices = append(cr.Devices, s)
				}
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
