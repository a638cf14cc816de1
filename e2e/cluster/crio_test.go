package cluster

import "testing"

// TestHugetlbUnmounted: the hugetlb controller is mounted for CRI-O only
// where the kernel has it enabled and no cgroup v1 hierarchy of it is mounted.
func TestHugetlbUnmounted(t *testing.T) {
	const cgroups = "#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t4\t203\t1\nhugetlb\t0\t5\t1\n"
	const mounted = "37 29 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"38 29 0:34 / /sys/fs/cgroup/hugetlb rw,relatime shared:9 - cgroup cgroup rw,hugetlb\n"
	const others = "37 29 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"40 29 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	for _, tc := range []struct {
		name, cgroups, mountinfo string
		want                     bool
	}{
		{"enabled, not mounted", cgroups, others, true},
		{"enabled and mounted", cgroups, mounted, false},
		{"disabled", "hugetlb\t0\t1\t0\n", others, false},
		{"absent", "#subsys_name\thierarchy\tnum_cgroups\tenabled\n", others, false},
		{"cgroup v2 host", cgroups, "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", false},
	} {
		if got := hugetlbUnmounted(tc.cgroups, tc.mountinfo); got != tc.want {
			t.Errorf("%s: hugetlbUnmounted = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRootPrivate: the namespace's / is made rshared for CRI-O only where
// the host's visible / has neither shared nor slave propagation.
func TestRootPrivate(t *testing.T) {
	const private = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n28 27 0:5 / /dev rw - devtmpfs udev rw\n"
	const shared = "27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n28 27 0:5 / /dev rw shared:2 - devtmpfs udev rw\n"
	const slave = "500 499 0:50 / / rw,relatime master:1 - overlay overlay rw\n"
	const sharedAndSlave = "500 499 0:50 / / rw shared:7 master:1 - overlay overlay rw\n"
	// A container's: the image's root mounted over a shared /.
	const overmounted = shared + "600 27 0:60 / / rw,relatime - overlay overlay rw\n"
	for _, tc := range []struct {
		name, mountinfo string
		want            bool
	}{
		{"private", private, true},
		{"shared", shared, false},
		{"slave", slave, false},
		{"shared and slave", sharedAndSlave, false},
		{"private over shared", overmounted, true},
		{"no mount at /", "28 27 0:5 / /dev rw - devtmpfs udev rw\n", false},
		{"empty", "", false},
	} {
		if got := rootPrivate(tc.mountinfo); got != tc.want {
			t.Errorf("%s: rootPrivate = %v, want %v", tc.name, got, tc.want)
		}
	}
}
