// Package deviceplugin runs NVIDIA's device plugin (k8s-device-plugin) the way
// a cluster without NVIDIA's container toolkit runs it: a DaemonSet pod with
// --pass-device-specs that reads the node's own NVML (the stand-in driver in
// the e2e suite, the real one on a GPU machine) and hands each GPU container
// its device nodes, never a driver file: that is gpu-injector's job.
//
// hack/tools.sh builds the plugin from its Go module; Image wraps the binary
// in an image with the glibc it links, Manifest is the DaemonSet (the same
// file docs/helm.md points users at), and DeviceNodes gives a machine without
// a GPU the /dev entries a real driver creates, so the runtime can hand them out.
package deviceplugin

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

// Version is the release of NVIDIA's plugin that hack/tools.sh builds
// (e2e/cluster/versions.env); nvidia-device-plugin.yaml names the same one.
var Version = cluster.NvidiaDevicePluginVersion

// Image is the local name of the plugin's image, which ImageFiles builds.
var Image = "gpu-injector.local/nvidia-device-plugin:" + Version

// Name is the DaemonSet's name and its pods' app.kubernetes.io/name label.
const Name = "nvidia-device-plugin"

// Namespace is where Manifest puts the DaemonSet.
const Namespace = "kube-system"

//go:embed nvidia-device-plugin.yaml
var manifest string

// The values of the manifest that Manifest replaces.
var manifestImage = "image: nvcr.io/nvidia/k8s-device-plugin:" + Version

const manifestDriverRoot = "path: /usr/local/nvidia\n"

// Manifest returns the DaemonSet with the image and the node's driver folder
// (the one whose lib64/ holds libnvidia-ml.so.1) replaced.
func Manifest(image, driverRoot string) ([]byte, error) {
	if strings.Count(manifest, manifestImage) != 1 {
		return nil, fmt.Errorf("nvidia-device-plugin.yaml does not name the image of NVIDIA's device plugin %s (NVIDIA_DEVICE_PLUGIN_VERSION, from e2e/cluster/versions.env or the environment): the manifest and the version must name the same release", Version)
	}
	if strings.Count(manifest, manifestDriverRoot) != 1 {
		return nil, errors.New("nvidia-device-plugin.yaml no longer holds the driver folder Manifest replaces")
	}
	m := strings.Replace(manifest, manifestImage, "image: "+image, 1)
	return []byte(strings.Replace(m, manifestDriverRoot, "path: "+driverRoot+"\n", 1)), nil
}

// Binary returns the cached plugin binary under cacheDir (see cluster.CacheDir).
func Binary(cacheDir string) (string, error) {
	p := filepath.Join(cacheDir, "nvidia-device-plugin-"+Version, "nvidia-device-plugin")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("NVIDIA's device plugin %s is missing: run hack/tools.sh nvidia-device-plugin first: %w", Version, err)
	}
	return p, nil
}

// BinaryPath is where the image holds the plugin, on the image's PATH.
const BinaryPath = "/usr/bin/nvidia-device-plugin"

// Device nodes of the NVIDIA driver: majors as the kernel module registers
// them (nvidia-uvm's is dynamic; this is a free one), minors as nvidia-smi's
// indexes for the GPUs and 255 for the control node.
const (
	nvidiaMajor = 195
	uvmMajor    = 511
	ctlMinor    = 255
)

// DeviceNodes names the nodes a driver with gpus GPUs creates.
func DeviceNodes(gpus int) map[string][2]uint32 {
	nodes := map[string][2]uint32{
		"/dev/nvidiactl":        {nvidiaMajor, ctlMinor},
		"/dev/nvidia-uvm":       {uvmMajor, 0},
		"/dev/nvidia-uvm-tools": {uvmMajor, 1},
	}
	for i := range gpus {
		nodes["/dev/nvidia"+strconv.Itoa(i)] = [2]uint32{nvidiaMajor, uint32(i)}
	}
	return nodes
}

// CreateDeviceNodes makes each node of DeviceNodes(gpus) that is missing
// under root (a real driver's are left alone) and returns those it made, for
// RemoveDeviceNodes. A container that opens one gets ENXIO: no driver answers.
func CreateDeviceNodes(root string, gpus int) ([]string, error) {
	var made []string
	for p, mm := range DeviceNodes(gpus) {
		full := filepath.Join(root, p)
		if _, err := os.Lstat(full); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return made, fmt.Errorf("failed to inspect %s: %w", full, err)
		}
		if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			return made, fmt.Errorf("failed to create device node %s: %w", full, err)
		}
		made = append(made, full)
		// 0666 as the driver makes them, whatever the umask: CUDA
		// containers run as any user.
		if err := os.Chmod(full, 0o666); err != nil {
			return made, fmt.Errorf("failed to chmod device node %s: %w", full, err)
		}
	}
	return made, nil
}

// RemoveDeviceNodes removes what CreateDeviceNodes made.
func RemoveDeviceNodes(paths []string) error {
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("failed to remove device node %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// ImageFiles returns the files of the plugin's image (container path -> host
// path): the binary, the glibc it links and what the driver's libnvidia-ml,
// which it loads, links besides.
func ImageFiles(binary string) (map[string]string, error) {
	rt, err := ociimage.DriverRuntimeFiles(binary)
	if err != nil {
		return nil, err
	}
	files := map[string]string{BinaryPath: binary}
	for _, f := range rt {
		files[f.Dest] = f.Source
	}
	return files, nil
}

// ImageEnv is the image's environment: PATH, for the manifest's command.
var ImageEnv = []string{"PATH=/usr/bin:/bin"}
