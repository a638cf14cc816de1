package nodeprobe

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// mockGPU is one device of fakeNVML.
type mockGPU struct {
	name         string
	memBytes     uint64
	major, minor int
	mig          nvml.Return // SUCCESS: MIG on; ERROR_NOT_SUPPORTED: no MIG
}

var h100 = mockGPU{name: "NVIDIA H100 80GB HBM3", memBytes: 81559 << 20, major: 9, minor: 0, mig: nvml.ERROR_NOT_SUPPORTED}

// fakeNVML is go-nvml's mock with only the calls the probe is allowed to
// make: any other call panics in the mock, which keeps the symbol list honest.
func fakeNVML(version string, cuda int, gpus ...mockGPU) *mock.Interface {
	m := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return version, nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) {
			return cuda, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(gpus), nvml.SUCCESS },
	}
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(gpus) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g := gpus[i]
		return &mock.Device{
			GetNameFunc:       func() (string, nvml.Return) { return g.name, nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: g.memBytes}, nvml.SUCCESS },
			GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) {
				return g.major, g.minor, nvml.SUCCESS
			},
			GetMigModeFunc: func() (int, int, nvml.Return) {
				if g.mig == nvml.SUCCESS {
					return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
				}
				return 0, 0, g.mig
			},
		}, nvml.SUCCESS
	}
	return m
}

func openWith(lib NVML) func(string) (NVML, error) {
	return func(string) (NVML, error) { return lib, nil }
}
