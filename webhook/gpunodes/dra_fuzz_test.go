package gpunodes

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// FuzzResourceSlices plays a fuzzed sequence of ResourceSlice events (any
// driver, pool, generation, node and device types, as DRA drivers publish
// them) into the DRA cache and checks the GPUs the index then counts per
// node against a model written apart from the code: per pool only the
// newest generation counts, whole GPUs win over their partitions, a node
// counts at most MaxNodeGPUs; deleting every slice leaves the allocatable.
func FuzzResourceSlices(f *testing.F) {
	cfg := config.Default()
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "580.95.05", Mounts: []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}}}
	ann, err := layout.Encode(plan)
	if err != nil {
		f.Fatal(err)
	}
	nodes := []string{"n0", "n1", "n2", "gone"}
	allocatable := map[string]int64{"n0": 0, "n1": 1, "n2": 250}
	types := []string{"gpu", "mig", "", "nic"}
	drivers := []string{"gpu.nvidia.com", "dra.net"}

	// Each event is 5 bytes: what, slice, node/pool/driver, generation, devices.
	f.Add([]byte{0, 0, 0, 1, 0x12, 0, 1, 0, 2, 0x44})
	f.Add([]byte{0, 0, 2, 1, 0x0f, 0, 1, 2, 1, 0x31, 1, 0, 0, 0, 0})
	f.Add([]byte{0, 2, 0x21, 3, 0x25, 0, 3, 0x01, 1, 0x13, 1, 2, 0, 0, 0, 0, 1, 0x80, 1, 0x11})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 5*64 {
			return
		}
		idx := NewIndex(cfg, logr.Discard())
		for _, n := range nodes[:3] {
			idx.Update(readyGPUNode(n, plan.Fingerprint(), ann, allocatable[n]))
		}
		d := NewDRA(cfg, idx, nil, logr.Discard())
		live := map[string]*resourcev1.ResourceSlice{}

		for i := 0; i+5 <= len(prog); i += 5 {
			b := prog[i : i+5]
			name := fmt.Sprintf("s%d", b[1]%6)
			if b[0]%3 == 1 {
				d.deleteSlice(&resourcev1.ResourceSlice{})
				if s, ok := live[name]; ok {
					d.deleteSlice(s)
					delete(live, name)
				}
				continue
			}
			node := nodes[b[2]%4]
			s := &resourcev1.ResourceSlice{}
			s.Name = name
			s.Spec.Driver = drivers[(b[2]>>5)%2]
			s.Spec.Pool = resourcev1.ResourcePool{Name: fmt.Sprintf("p%d", (b[2]>>2)%3), Generation: int64(b[3] % 4), ResourceSliceCount: 1}
			perDevice := b[2]&0x80 != 0
			if !perDevice {
				s.Spec.NodeName = &node
			}
			for j := 0; j < int(b[4]&0x0f); j++ {
				ty := types[(int(b[4]>>4)+j)%len(types)]
				dev := resourcev1.Device{Name: fmt.Sprintf("d%d", j)}
				if ty != "" {
					dev.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"type": {StringValue: &ty}}
				}
				if perDevice {
					n := nodes[(j+int(b[3]))%4]
					dev.NodeName = &n
				}
				s.Spec.Devices = append(s.Spec.Devices, dev)
			}
			live[name] = s
			if b[0]%3 == 2 {
				d.setSlice(s) // unstripped, as a cache without the transform
			} else {
				stripped, err := stripSlice(s.DeepCopy())
				if err != nil {
					t.Fatal(err)
				}
				d.setSlice(stripped)
			}
		}
		checkDRACounts(t, idx, live, allocatable)
		for name, s := range live {
			d.deleteSlice(s)
			delete(live, name)
		}
		checkDRACounts(t, idx, live, allocatable)
	})
}

// checkDRACounts compares the index's GPUs per node with a model of the
// slices alive.
func checkDRACounts(t *testing.T, idx *Index, live map[string]*resourcev1.ResourceSlice, allocatable map[string]int64) {
	t.Helper()
	newest := map[string]int64{}
	for _, s := range live {
		if s.Spec.Driver != "gpu.nvidia.com" {
			continue
		}
		k := s.Spec.Driver + "/" + s.Spec.Pool.Name
		newest[k] = max(newest[k], s.Spec.Pool.Generation)
	}
	want := map[string]int64{}
	for _, s := range live {
		if s.Spec.Driver != "gpu.nvidia.com" || s.Spec.Pool.Generation != newest[s.Spec.Driver+"/"+s.Spec.Pool.Name] {
			continue
		}
		whole, all := map[string]int64{}, map[string]int64{}
		for _, dev := range s.Spec.Devices {
			n := dev.NodeName
			if s.Spec.NodeName != nil {
				n = s.Spec.NodeName
			}
			if n == nil {
				continue
			}
			all[*n]++
			if ty := dev.Attributes["type"].StringValue; ty == nil || *ty == "gpu" {
				whole[*n]++
			}
		}
		for n, c := range all {
			if whole[n] > 0 {
				c = whole[n]
			}
			want[n] += c
		}
	}
	got := map[string]int64{}
	for _, l := range idx.Layouts() {
		for _, n := range l.Nodes {
			got[n.Name] = n.AllocatableGPUs
		}
	}
	for n, a := range allocatable {
		w := min(a+min(want[n], MaxNodeGPUs), MaxNodeGPUs)
		if got[n] != w {
			t.Fatalf("node %s counts %d GPUs, want %d (allocatable %d, %d in live slices)", n, got[n], w, a, want[n])
		}
	}
}
