package imageconfig

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
)

// BenchmarkReadCached is what a cached image costs an admission: a tag
// believed, its digest's facts found. docs/benchmarks.md.
func BenchmarkReadCached(b *testing.B) {
	tr := newTestRegistry(&testing.T{}, "", "")
	defer tr.srv.Close()
	r := tr.reader(Options{TagTTL: time.Hour})
	image := tr.host + "/app:v1"
	tr.push(&testing.T{}, "app:v1", ngcEnv(0), ngcLabels())
	if _, err := r.Read(context.Background(), image, Anonymous); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Read(ctx, image, Anonymous); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCacheMemory fills a cache with 10,000 images of an NGC image's
// size of ENV and labels (about 2.5 KiB) and reports the heap they hold and
// the cache's own estimate. Run it once: -bench CacheMemory -benchtime 1x.
// docs/benchmarks.md.
func BenchmarkCacheMemory(b *testing.B) {
	const n = 10000
	for b.Loop() {
		r := New(Options{Registries: []string{"nvcr.io"}, TagTTL: time.Hour, MaxEntries: n, MaxBytes: 1 << 30})
		before := heap()
		for i := range n {
			ref, err := name.ParseReference(fmt.Sprintf("nvcr.io/nvidia/pytorch:24.%d-py3", i))
			if err != nil {
				b.Fatal(err)
			}
			r.store(ref, &Facts{Digest: fmt.Sprintf("sha256:%064x", i), Env: ngcEnv(i), Labels: ngcLabels()})
		}
		after := heap()
		b.ReportMetric(float64(after-before)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(r.Bytes())/(1<<20), "estimate-MiB")
		runtime.KeepAlive(r)
	}
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// ngcEnv is the ENV of NVIDIA's PyTorch image (24.05), each value made
// distinct by i, as images decoded one by one do not share strings.
func ngcEnv(i int) []string {
	env := []string{
		"PATH=/usr/local/lib/python3.10/dist-packages/torch_tensorrt/bin:/usr/local/mpi/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/ucx/bin:/opt/tensorrt/bin",
		"CUDA_VERSION=12.4.1.003", "CUDA_DRIVER_VERSION=550.54.15", "CUDA_CACHE_DISABLE=1",
		"NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=", "_CUDA_COMPAT_PATH=/usr/local/cuda/compat",
		"ENV=/etc/shinit_v2", "BASH_ENV=/etc/bash.bashrc", "SHELL=/bin/bash",
		"NVIDIA_REQUIRE_CUDA=cuda>=9.0", "NCCL_VERSION=2.21.5", "CUBLAS_VERSION=12.4.5.8",
		"CUFFT_VERSION=11.2.1.3", "CURAND_VERSION=10.3.5.147", "CUSPARSE_VERSION=12.3.1.170",
		"CUSOLVER_VERSION=11.6.1.9", "CUTENSOR_VERSION=2.0.1.2", "NPP_VERSION=12.2.5.30",
		"NVJPEG_VERSION=12.3.1.117", "CUDNN_VERSION=9.1.0.70", "TRT_VERSION=10.0.1.6",
		"TRTOSS_VERSION=", "NSIGHT_SYSTEMS_VERSION=2024.2.1.106", "NSIGHT_COMPUTE_VERSION=2024.1.1.4",
		"DALI_VERSION=1.37.1", "DALI_BUILD=14102866", "POLYGRAPHY_VERSION=0.49.9",
		"TRANSFORMER_ENGINE_VERSION=1.6", "LD_LIBRARY_PATH=/usr/local/lib/python3.10/dist-packages/torch/lib:/usr/local/lib/python3.10/dist-packages/torch_tensorrt/lib:/usr/local/cuda/compat/lib:/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
		"NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video",
		"NVIDIA_PRODUCT_NAME=PyTorch", "PYTORCH_VERSION=2.4.0a0+07cecf4", "PYTORCH_BUILD_NUMBER=0",
		"NVIDIA_PYTORCH_VERSION=24.05", "PYTHONIOENCODING=utf-8", "LC_ALL=C.UTF-8",
		"PIP_DEFAULT_TIMEOUT=100", "JUPYTER_PORT=8888", "TENSORBOARD_PORT=6006",
		"UCX_MEMTYPE_CACHE=n", "TORCH_CUDA_ARCH_LIST=5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX",
	}
	for j := range env {
		env[j] = strings.Clone(env[j])
	}
	env = append(env, fmt.Sprintf("NVIDIA_BUILD_ID=%d", 94000000+i))
	return env
}

func ngcLabels() map[string]string {
	return map[string]string{
		"com.nvidia.build.id": "94000000", "com.nvidia.build.ref": "2c8a4e3f6b0f11f6a3b5b8f5c1e9d1f8e0c2d7a1",
		"com.nvidia.cuda.version": "12.4.1.003", "com.nvidia.cudnn.version": "9.1.0.70",
		"com.nvidia.nccl.version": "2.21.5", "com.nvidia.pytorch.version": "2.4.0a0+07cecf4",
		"com.nvidia.volumes.needed": "nvidia_driver", "org.opencontainers.image.ref.name": "ubuntu",
		"org.opencontainers.image.version": "22.04",
	}
}
