package nodeprobe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/hack/testfixtures/fakeroot"
	"github.com/gpu-injector/gpu-injector/layout"
)

// packagingFact is one thing a distribution's own packaging puts on its GPU
// nodes, with where it says so: the fake root must carry it, so that it
// cannot drift from its source.
type packagingFact struct {
	path, holds string
	// link is the link target, when the path is a link.
	link   string
	source string
}

// TestPlatformsAsTheirPackagingShipsThem: on Bottlerocket, Amazon Linux 2023
// (the EKS NVIDIA AMI) and OpenShift with the GPU operator, the fake roots
// carry what those distributions' own sources install, and the probe reports
// what actually gives containers the driver there: the NVIDIA container
// toolkit, under whatever name each runs it. It publishes no host path
// mount, which would inject the driver a second time (and force the pod's
// namespace to privileged Pod Security).
func TestPlatformsAsTheirPackagingShipsThem(t *testing.T) {
	const (
		brKit = "bottlerocket-os/bottlerocket-core-kit "
		eks   = "awslabs/amazon-eks-ami "
		gpuOp = "NVIDIA/gpu-operator "
		ctk   = "NVIDIA/nvidia-container-toolkit "
	)
	for name, tc := range map[string]struct {
		facts []packagingFact
		// evidence is what the probe must name as the injector.
		evidence []string
	}{
		"bottlerocket-nvidia": {
			facts: []packagingFact{
				{path: "/usr/lib/nvidia/tesla/libcuda.so." + fakeroot.VersionBottlerocket, source: brKit + "packages/kmod-6.1-nvidia/kmod-6.1-nvidia.spec (tesla_ver 535.216.01; install *.so* to %{_cross_libdir}/nvidia/tesla)"},
				{path: "/usr/lib/nvidia/tesla/libnvidia-ml.so.1", link: "libnvidia-ml.so." + fakeroot.VersionBottlerocket, source: brKit + "packages/kmod-6.1-nvidia/kmod-6.1-nvidia.spec (ln -s the library at its SONAME)"},
				{path: "/usr/libexec/nvidia/tesla/bin/nvidia-smi", source: brKit + "packages/kmod-6.1-nvidia/kmod-6.1-nvidia.spec (install nvidia-smi to %{_cross_libexecdir}/nvidia/tesla/bin)"},
				{path: "/etc/ld.so.conf.d/nvidia-tesla.conf", holds: "/usr/lib/nvidia/tesla/", source: brKit + "packages/kmod-6.1-nvidia/nvidia-ld.so.conf.in (__LIBDIR__/nvidia/tesla/)"},
				{path: "/etc/containerd/config.toml", holds: `default_runtime_name = "nvidia"`, source: brKit + "packages/containerd/containerd-config-toml_k8s_nvidia_containerd_sock"},
				{path: "/etc/containerd/config.toml", holds: `BinaryName = "nvidia-oci"`, source: brKit + "packages/containerd/containerd-config-toml_k8s_nvidia_containerd_sock"},
				{path: "/usr/bin/nvidia-oci", link: "shimpei", source: brKit + "packages/nvidia-container-toolkit/nvidia-container-toolkit.spec (ln -s shimpei %{_cross_bindir}/nvidia-oci)"},
				{path: "/etc/shimpei/nvidia-oci-hooks.json", holds: `"path": "/usr/bin/nvidia-container-runtime-hook"`, source: brKit + "sources/shimpei/src/main.rs (HOOKS_CONFIG_BASE_PATH /etc/shimpei, <argv[0]>-hooks.json); packages/nvidia-container-toolkit/nvidia-oci-hooks-json"},
				{path: "/etc/nvidia-container-runtime/config.toml", holds: `ldconfig = "@/sbin/ldconfig"`, source: brKit + "packages/nvidia-container-toolkit/nvidia-container-toolkit-config-k8s"},
			},
			evidence: []string{`the default runtime "nvidia" runs /usr/bin/nvidia-oci (/usr/bin/shimpei)`, "/etc/shimpei/nvidia-oci-hooks.json: prestart hook /usr/bin/nvidia-container-runtime-hook"},
		},
		"amazonlinux2023-eks-nvidia": {
			facts: []packagingFact{
				{path: "/usr/lib64/libcuda.so." + fakeroot.Version570, source: "NVIDIA/yum-packaging-nvidia-driver nvidia-driver.spec (%files cuda-libs: %{_libdir}/libcuda.so.%{version}); " + eks + "templates/al2023/provisioners/install-nvidia-driver.sh (dnf install nvidia-driver-cuda)"},
				{path: "/usr/bin/nvidia-smi", source: "NVIDIA/yum-packaging-nvidia-driver nvidia-driver.spec (%{_bindir}/nvidia-smi)"},
				{path: "/etc/containerd/config.toml", holds: "default_runtime_name = 'nvidia'", source: eks + "nodeadm/test/e2e/cases/containerdv2-runtime-config-nvidia/expected-containerd-configv3.toml"},
				{path: "/etc/containerd/config.toml", holds: "BinaryName = '/usr/bin/nvidia-container-runtime'", source: eks + "nodeadm/internal/containerd/runtime_config_nvidia.go (nvidiaRuntimeBinaryPath)"},
				{path: "/usr/bin/nvidia-container-runtime", source: eks + "nodeadm/internal/containerd/runtime_config_nvidia.go (the mixin applies when the binary exists); install-nvidia-driver.sh (dnf install nvidia-container-toolkit)"},
			},
			evidence: []string{`the default runtime "nvidia" runs /usr/bin/nvidia-container-runtime`},
		},
		"gpu-operator-openshift": {
			facts: []packagingFact{
				{path: "/run/containers/oci/hooks.d/oci-nvidia-hook.json", holds: `"always":true`, source: gpuOp + "assets/state-container-toolkit/0500_daemonset.yaml (crio-hooks hostPath /run/containers/oci/hooks.d); controllers/object_controls.go (CRIO_CONFIG_MODE hook; /usr/share/containers/oci/hooks.d only off OpenShift); " + ctk + "cmd/nvidia-ctk-installer/container/runtime/crio/crio.go (oci-nvidia-hook.json), pkg/config/ocihook/oci-hook.go (when.always)"},
				{path: "/run/containers/oci/hooks.d/oci-nvidia-hook.json", holds: `/usr/local/nvidia/toolkit/nvidia-container-runtime-hook`, source: gpuOp + "assets/state-container-toolkit/0500_daemonset.yaml (toolkit-install-dir /usr/local/nvidia)"},
				{path: "/run/nvidia/driver/usr/lib64/libcuda.so." + fakeroot.Version550, source: gpuOp + "cmd/nvidia-validator/main.go (defaultDriverInstallDir /run/nvidia/driver)"},
				{path: "/run/nvidia/validations/driver-ready", source: gpuOp + "cmd/nvidia-validator/main.go (defaultStatusPath, driverStatusFile)"},
			},
			evidence: []string{"OCI hook /run/containers/oci/hooks.d/oci-nvidia-hook.json runs /usr/local/nvidia/toolkit/nvidia-container-runtime-hook in every container"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			root, _ := buildRoot(t, name)
			for _, f := range tc.facts {
				checkFact(t, root, f)
			}
			res := probeRoot(t, root, noNVML)
			if !res.Ready() {
				t.Fatalf("not ready: %s", res.Reason())
			}
			if res.Plan.RuntimeInjection != layout.RuntimeToolkit || len(res.Plan.Mounts) != 0 {
				t.Fatalf("plan: runtimeInjection %q with %d mounts %+v, want the toolkit and no mount (evidence %q)",
					res.Plan.RuntimeInjection, len(res.Plan.Mounts), res.Plan.Mounts, res.Evidence)
			}
			all := strings.Join(res.Evidence, "\n")
			for _, want := range tc.evidence {
				if !strings.Contains(all, want) {
					t.Errorf("evidence lacks %q:\n%s", want, all)
				}
			}
		})
	}
}

func checkFact(t *testing.T, root string, f packagingFact) {
	t.Helper()
	p := filepath.Join(root, f.path)
	if f.link != "" {
		if got, err := os.Readlink(p); err != nil || got != f.link {
			t.Errorf("%s: link to %q (%v), want %q, as %s", f.path, got, err, f.link, f.source)
		}
		return
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("%s missing (%v), which %s installs", f.path, err, f.source)
		return
	}
	if !strings.Contains(string(data), f.holds) {
		t.Errorf("%s lacks %q, as %s has it", f.path, f.holds, f.source)
	}
}
