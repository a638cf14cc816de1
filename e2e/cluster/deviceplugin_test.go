//go:build e2e

package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// testPlugin offers a fixed set of healthy devices; enough for the kubelet
// to advertise capacity.
type testPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	ids []string
}

func (p *testPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *testPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.ids {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := s.Send(resp); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// serveDevicePlugin registers resource with the cluster's kubelet through
// DevicePluginDir, as a device plugin DaemonSet would through its hostPath.
func serveDevicePlugin(ctx context.Context, c *Cluster, resource string, ids []string) error {
	const endpoint = "test-plugin.sock"
	sock := filepath.Join(c.DevicePluginDir, endpoint)
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &testPlugin{ids: ids})
	go func() { _ = srv.Serve(l) }()
	context.AfterFunc(ctx, srv.Stop)

	conn, err := grpc.NewClient("unix://"+filepath.Join(c.DevicePluginDir, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("failed to dial kubelet: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
	})
	if err != nil {
		return fmt.Errorf("failed to register with kubelet: %w", err)
	}
	return nil
}

func TestDevicePluginDir(t *testing.T) {
	ctx := t.Context()
	c, err := Start(ctx, Options{NodeName: "plugin-node"})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	pluginCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := serveDevicePlugin(pluginCtx, c, "example.com/gpu", []string{"gpu-0", "gpu-1", "gpu-2"}); err != nil {
		t.Fatal(err)
	}
	var got string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := n.Status.Allocatable["example.com/gpu"]
		got = q.String()
		return q.Value() == 3, nil
	})
	if err != nil {
		t.Fatalf("node allocatable example.com/gpu = %q, want 3: %v\nkubelet log:\n%s", got, err, tailFile(c.LogPath("kubelet"), 20))
	}
}
