// cuda-smoke: the CUDA program of the real-GPU cluster run (hack/gpu-cluster.sh).
//
// Built with `nvcc -cudart static -o cuda-smoke cuda-smoke.cu`, so the CUDA
// runtime is inside the binary and the only NVIDIA file it needs at run time
// is the driver's libcuda.so.1: exactly what gpu-injector injects. Without it
// the first CUDA call fails with "CUDA driver version is insufficient for CUDA
// runtime version" (cudaErrorInsufficientDriver), and the program exits 1.
//
// It prints the device's name, runs saxpy (y = a*x + y) on n floats, checks
// every element on the host and prints "CUDA kernel result: OK (...)" or FAIL.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t err_ = (call);                                                       \
    if (err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "CUDA error: %s (%s) at %s:%d: %s\n", cudaGetErrorString(err_), \
                   cudaGetErrorName(err_), __FILE__, __LINE__, #call);               \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void saxpy(int n, float a, const float *x, float *y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

int main(int argc, char **argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1 << 20;
  if (n <= 0) {
    std::fprintf(stderr, "usage: cuda-smoke [N>0]\n");
    return 2;
  }
  int driverVersion = 0, runtimeVersion = 0;
  CHECK(cudaRuntimeGetVersion(&runtimeVersion));
  // cudaDriverGetVersion reports 0 rather than failing when libcuda is missing.
  CHECK(cudaDriverGetVersion(&driverVersion));
  std::printf("CUDA runtime %d.%d, driver API %d.%d\n", runtimeVersion / 1000, (runtimeVersion % 1000) / 10,
              driverVersion / 1000, (driverVersion % 1000) / 10);

  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  std::printf("CUDA devices: %d\n", count);
  CHECK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Device 0: %s (compute capability %d.%d, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));

  const float a = 2.5f;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; i++) {
    x[i] = static_cast<float>(i % 1000) * 0.001f;
    y[i] = static_cast<float>(i % 7) - 3.0f;
  }
  float *dx = nullptr, *dy = nullptr;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const int threads = 256;
  const int blocks = (n + threads - 1) / threads < 4096 ? (n + threads - 1) / threads : 4096;
  saxpy<<<blocks, threads>>>(n, a, dx, dy);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> out(n);
  CHECK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dy));

  double maxErr = 0.0;
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const double want = static_cast<double>(a) * x[i] + y[i];
    const double e = std::fabs(static_cast<double>(out[i]) - want);
    if (e > maxErr) maxErr = e;
    if (!(e <= 1e-5)) bad++;  // also catches NaN
  }
  if (bad != 0) {
    std::printf("CUDA kernel result: FAIL (n=%d, %d wrong, max error=%g)\n", n, bad, maxErr);
    return 1;
  }
  std::printf("CUDA kernel result: OK (n=%d, max error=%g)\n", n, maxErr);
  return 0;
}
