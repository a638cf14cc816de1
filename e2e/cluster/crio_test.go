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
