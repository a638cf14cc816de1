// Command fake-gpu-plugin advertises made-up GPUs to a kubelet, for end-to-end
// tests of gpu-injector on a node with no GPU. It is a test tool: the devices
// it offers are named stand-in-N and give a container nothing but an
// environment variable.
//
//	fake-gpu-plugin --device-plugin-dir /var/lib/kubelet/device-plugins --count 2
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-injector/gpu-injector/e2e/deviceplugin"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("device-plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device plugin folder, holding kubelet.sock")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource to advertise")
	count := flag.Int("count", 2, "number of devices to advertise")
	verbosity := flag.Int("v", 0, "log verbosity")
	flag.Parse()

	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zapcore.Level(-*verbosity))
	zl, err := cfg.Build()
	if err != nil {
		return fmt.Errorf("failed to build logger: %w", err)
	}
	defer zl.Sync()
	log := zapr.NewLogger(zl)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("starting fake device plugin", "dir", *dir, "resource", *resource, "count", *count)
	return deviceplugin.Serve(logr.NewContext(ctx, log), *dir, *resource, *count)
}
