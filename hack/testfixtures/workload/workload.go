// Package workload makes the GPU nodes and pods that the load script sends
// through a real API server and that BenchmarkHandler sends through the
// handler in process, so both measure the same shapes.
package workload

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-injector/gpu-injector/layout"
)

// LooseFilePlan is a driver installed by distribution packages: every
// library and binary a file of its own in shared system folders, so the
// probe publishes one file mount each (19 here, as on Ubuntu 22.04).
func LooseFilePlan(version string) layout.Plan {
	libs := []string{
		"libcuda.so", "libcuda.so.1", "libcuda.so." + version, "libcudadebugger.so.1",
		"libnvidia-allocator.so.1", "libnvidia-cfg.so.1", "libnvidia-gpucomp.so." + version,
		"libnvidia-ml.so", "libnvidia-ml.so.1", "libnvidia-ml.so." + version,
		"libnvidia-nvvm.so.4", "libnvidia-opencl.so.1", "libnvidia-pkcs11-openssl3.so." + version,
		"libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so." + version,
	}
	bins := []string{"nvidia-cuda-mps-control", "nvidia-debugdump", "nvidia-persistenced", "nvidia-smi"}
	p := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: version, CUDADriverVersion: "12.4", LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	for _, l := range libs {
		p.Mounts = append(p.Mounts, layout.Mount{HostPath: "/usr/lib/x86_64-linux-gnu/" + l, ContainerPath: "/usr/local/nvidia/lib64/" + l, Kind: layout.KindFile})
	}
	for _, b := range bins {
		p.Mounts = append(p.Mounts, layout.Mount{HostPath: "/usr/bin/" + b, ContainerPath: "/usr/local/nvidia/bin/" + b, Kind: layout.KindFile})
	}
	p.Normalize()
	return p
}

// FolderPlan is a driver in a folder of its own (the Ubuntu nvidia-NNN
// packages of old, or a GPU operator's): two folder mounts.
func FolderPlan(version string) layout.Plan {
	major, _, _ := strings.Cut(version, ".")
	return layout.Plan{
		SchemaVersion: layout.SchemaVersion, DriverVersion: version, LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{
			{HostPath: "/usr/lib/nvidia-" + major, ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory},
			{HostPath: "/usr/lib/nvidia-" + major + "/bin", ContainerPath: "/usr/local/nvidia/bin", Kind: layout.KindDirectory},
		},
	}
}

// Pool is a group of identical GPU nodes.
type Pool struct {
	Plan         layout.Plan
	GPUs         int64
	InstanceType string
	Product      string
	// Family, MemoryMiB and Compute are what GPU feature discovery labels.
	Family    string
	MemoryMiB int
	Compute   [2]int
}

// Pools are the node layouts of the load script and the benchmark: most
// GPUs on the loose-file layout, so that is the one pods get.
func Pools() []Pool {
	return []Pool{
		{Plan: LooseFilePlan("550.54.15"), GPUs: 8, InstanceType: "p5.48xlarge", Product: "NVIDIA-H100-80GB-HBM3", Family: "hopper", MemoryMiB: 81559, Compute: [2]int{9, 0}},
		{Plan: FolderPlan("535.104.05"), GPUs: 4, InstanceType: "g5.12xlarge", Product: "NVIDIA-A10G", Family: "ampere", MemoryMiB: 23028, Compute: [2]int{8, 6}},
		{Plan: LooseFilePlan("470.256.02"), GPUs: 1, InstanceType: "p3.2xlarge", Product: "Tesla-V100-SXM2-16GB", Family: "volta", MemoryMiB: 16384, Compute: [2]int{7, 0}},
	}
}

// Node is node i of n: pools in turn, three zones, every tenth node tainted
// as GPU node pools often are, with the labels, images and status a real
// kubelet, the probe, the GPU operator, Node Feature Discovery and GPU
// feature discovery leave on it (114 labels, one of them, GPU feature
// discovery's timestamp, different on every node).
func Node(i int) *corev1.Node {
	pools := Pools()
	pool := pools[i%len(pools)]
	name := fmt.Sprintf("gpu-%05d", i)
	enc, err := layout.Encode(pool.Plan)
	if err != nil {
		panic(err)
	}
	zone := fmt.Sprintf("us-east-1%c", 'a'+i%3)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
				"node.kubernetes.io/instance-type": pool.InstanceType, "beta.kubernetes.io/instance-type": pool.InstanceType,
				"topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": zone,
				"failure-domain.beta.kubernetes.io/region": "us-east-1", "failure-domain.beta.kubernetes.io/zone": zone,
				"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": pool.Product, "nvidia.com/gpu.count": fmt.Sprint(pool.GPUs),
				layout.LabelState: layout.StateReady, layout.LabelFingerprint: pool.Plan.Fingerprint(),
				layout.LabelDriverVersion: pool.Plan.DriverVersion, layout.LabelGPUProduct: pool.Product, layout.LabelGPUCount: fmt.Sprint(pool.GPUs),
			},
			Annotations: map[string]string{
				layout.AnnotationLayout:                                  enc,
				"node.alpha.kubernetes.io/ttl":                           "0",
				"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			},
		},
		Spec: corev1.NodeSpec{
			ProviderID: "aws:///" + zone + "/i-0" + fmt.Sprintf("%016x", i),
			// As a kubelet registers: the node lifecycle controller lifts
			// it once the node is Ready; the load script does that itself.
			Taints: []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	if i%10 == 0 {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	}
	for k, v := range discoveredLabels(pool, i) {
		n.Labels[k] = v
	}
	return n
}

// cpuFeatures are the CPUID flags Node Feature Discovery labels on a recent
// x86 server, one label each.
var cpuFeatures = []string{"ADX", "AESNI", "AMXBF16", "AMXINT8", "AMXTILE", "AVX", "AVX2", "AVX512BF16", "AVX512BITALG",
	"AVX512BW", "AVX512CD", "AVX512DQ", "AVX512F", "AVX512FP16", "AVX512IFMA", "AVX512VBMI", "AVX512VBMI2", "AVX512VL",
	"AVX512VNNI", "AVX512VPOPCNTDQ", "AVXVNNI", "CMPXCHG8", "FMA3", "FXSR", "FXSROPT", "GFNI", "HYPERVISOR", "LAHF",
	"MOVBE", "MOVDIR64B", "MOVDIRI", "OSXSAVE", "SERIALIZE", "SHA", "SPEC_CTRL_SSBD", "SYSCALL", "SYSEE", "TSXLDTRK",
	"VAES", "VPCLMULQDQ", "WAITPKG", "X87", "XGETBV1", "XSAVE", "XSAVEC", "XSAVEOPT", "XSAVES"}

// discoveredLabels are the labels the GPU operator's Node Feature Discovery
// and GPU feature discovery put on node i of pool.
func discoveredLabels(pool Pool, i int) map[string]string {
	const nfd = "feature.node.kubernetes.io/"
	driver := strings.Split(pool.Plan.DriverVersion, ".")
	for len(driver) < 3 {
		driver = append(driver, "0")
	}
	m := map[string]string{
		nfd + "cpu-cpuid.AVX512F":                     "true",
		nfd + "cpu-hardware_multithreading":           "true",
		nfd + "cpu-model.family":                      "6",
		nfd + "cpu-model.id":                          "143",
		nfd + "cpu-model.vendor_id":                   "Intel",
		nfd + "kernel-version.full":                   "6.8.0-1021-aws",
		nfd + "kernel-version.major":                  "6",
		nfd + "kernel-version.minor":                  "8",
		nfd + "kernel-version.revision":               "0",
		nfd + "pci-10de.present":                      "true",
		nfd + "pci-1d0f.present":                      "true",
		nfd + "storage-nonrotationaldisk":             "true",
		nfd + "system-os_release.ID":                  "ubuntu",
		nfd + "system-os_release.VERSION_ID":          "22.04",
		nfd + "system-os_release.VERSION_ID.major":    "22",
		nfd + "system-os_release.VERSION_ID.minor":    "04",
		"nvidia.com/cuda.driver-version.full":         pool.Plan.DriverVersion,
		"nvidia.com/cuda.driver-version.major":        driver[0],
		"nvidia.com/cuda.driver-version.minor":        driver[1],
		"nvidia.com/cuda.driver-version.revision":     driver[2],
		"nvidia.com/cuda.driver.major":                driver[0],
		"nvidia.com/cuda.driver.minor":                driver[1],
		"nvidia.com/cuda.driver.rev":                  driver[2],
		"nvidia.com/cuda.runtime-version.full":        "12.4",
		"nvidia.com/cuda.runtime-version.major":       "12",
		"nvidia.com/cuda.runtime-version.minor":       "4",
		"nvidia.com/cuda.runtime.major":               "12",
		"nvidia.com/cuda.runtime.minor":               "4",
		"nvidia.com/gfd.timestamp":                    fmt.Sprint(1718000000 + i),
		"nvidia.com/gpu.compute.major":                fmt.Sprint(pool.Compute[0]),
		"nvidia.com/gpu.compute.minor":                fmt.Sprint(pool.Compute[1]),
		"nvidia.com/gpu.family":                       pool.Family,
		"nvidia.com/gpu.machine":                      pool.InstanceType,
		"nvidia.com/gpu.memory":                       fmt.Sprint(pool.MemoryMiB),
		"nvidia.com/gpu.mode":                         "compute",
		"nvidia.com/gpu.replicas":                     "1",
		"nvidia.com/gpu.sharing-strategy":             "none",
		"nvidia.com/mig.capable":                      fmt.Sprint(pool.Family == "hopper"),
		"nvidia.com/mig.strategy":                     "single",
		"nvidia.com/mps.capable":                      "false",
		"nvidia.com/vgpu.present":                     "false",
		"nvidia.com/gpu.deploy.container-toolkit":     "true",
		"nvidia.com/gpu.deploy.dcgm":                  "true",
		"nvidia.com/gpu.deploy.dcgm-exporter":         "true",
		"nvidia.com/gpu.deploy.device-plugin":         "true",
		"nvidia.com/gpu.deploy.driver":                "true",
		"nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
		"nvidia.com/gpu.deploy.node-status-exporter":  "true",
		"nvidia.com/gpu.deploy.operator-validator":    "true",
	}
	for _, f := range cpuFeatures {
		m[nfd+"cpu-cpuid."+f] = "true"
	}
	return m
}

// NodeStatus is the status a kubelet would report for node i.
func NodeStatus(i int) corev1.NodeStatus {
	pool := Pools()[i%len(Pools())]
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("96"), corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods: resource.MustParse("110"), "nvidia.com/gpu": *resource.NewQuantity(pool.GPUs, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse("500Gi"),
	}
	st := corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
			{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
			{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}, {Type: corev1.NodeHostName, Address: fmt.Sprintf("gpu-%05d", i)}},
		NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", ContainerRuntimeVersion: "containerd://2.0.5", KernelVersion: "6.8.0-1021-aws", OSImage: "Ubuntu 22.04.5 LTS", OperatingSystem: "linux", Architecture: "amd64"},
	}
	for j := 0; j < 12; j++ {
		st.Images = append(st.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example.com/ml/image-%02d@sha256:%064x", j, j+1), fmt.Sprintf("registry.example.com/ml/image-%02d:v1.%d", j, j)},
			SizeBytes: int64(j+1) << 28,
		})
	}
	return st
}

// Sizes are the pod sizes of the load script and benchmark, by the bytes
// of the pod's JSON as a client sends it.
var Sizes = []struct {
	Name  string
	Bytes int
}{{"small", 2 << 10}, {"medium", 10 << 10}, {"large", 80 << 10}}

// SizeLabel marks a pod with its size, so the floor webhooks and the
// admission policy can tell which patch belongs to it.
const SizeLabel = "loadtest.gpu-injector.io/size"

// Pod is a three-container GPU pod (a trainer with one GPU and two
// sidecars) grown to about size bytes of JSON the way real pods grow:
// environment variables, arguments and config volumes.
func Pod(size string, bytes int) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "train-" + size, Labels: map[string]string{"app": "train", SizeLabel: size},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			// The token volume the API server would add differs by pod;
			// without it the pod the webhook sees is the one sent.
			AutomountServiceAccountToken: ptr.To(false),
			// Every list the patch appends to is there already: the admission
			// policy cannot add a list of objects where there is none (the
			// API server fails converting it), and real pods have them.
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{
				Name: "train", Image: "nvcr.io/nvidia/pytorch:24.05-py3",
				Command:      []string{"python", "-m", "torch.distributed.run"},
				Env:          []corev1.EnvVar{{Name: "TZ", Value: "UTC"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					"nvidia.com/gpu": resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourceCPU: resource.MustParse("8"),
				}},
			}, {
				Name: "metrics", Image: "prom/statsd-exporter:v0.26.0",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceCPU: resource.MustParse("100m")}},
			}, {
				Name: "logs", Image: "fluent/fluent-bit:3.0",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceCPU: resource.MustParse("100m")}},
			}},
		},
	}
	for i, n := 0, Bytes(p); n < bytes; i++ {
		c := &p.Spec.Containers[i%len(p.Spec.Containers)]
		c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("TRAIN_SETTING_%03d", i), Value: fmt.Sprintf("s3://datasets-example/team-%d/run-%04d/shard-%06d", i%7, i, i*31)})
		if i%6 == 0 {
			c.Args = append(c.Args, fmt.Sprintf("--option-%03d=%s", i, strings.Repeat("x", 24)))
		}
		if i%20 == 10 {
			v := fmt.Sprintf("config-%03d", i)
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: v}}}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v, MountPath: "/etc/" + v, ReadOnly: true})
		}
		if i%8 == 7 {
			n = Bytes(p)
		} else {
			n += 90
		}
	}
	for Bytes(p) > bytes+bytes/20 && len(p.Spec.Containers[0].Env) > 0 {
		c := &p.Spec.Containers[0]
		c.Env = c.Env[:len(c.Env)-1]
	}
	return p
}

// Bytes is the size of the pod's JSON.
func Bytes(p *corev1.Pod) int {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return len(b)
}

// ReadyNode is node i as it stands once registered and Ready: its status
// set and the not-ready taint lifted.
func ReadyNode(i int) *corev1.Node {
	n := Node(i)
	n.Status = NodeStatus(i)
	n.Spec.Taints = n.Spec.Taints[1:]
	return n
}
