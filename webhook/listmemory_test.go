package webhook

import "testing"

func TestListVerdict(t *testing.T) {
	const mi = 1 << 20
	for name, tc := range map[string]struct {
		nodes, soft, container int64
		hold, warn             bool
	}{
		"5,000 nodes, the chart's 256Mi":           {5000, 224 * mi, 256 * mi, false, false},
		"65,000 nodes, the chart's 256Mi":          {65000, 224 * mi, 256 * mi, false, false},
		"90,000 nodes, the chart's 256Mi":          {90000, 224 * mi, 256 * mi, true, true},
		"90,000 nodes, 384Mi":                      {90000, 352 * mi, 384 * mi, false, false},
		"378,000 nodes, 1Gi: soft short, hard not": {378000, 922 * mi, 1024 * mi, false, true},
		"GOMEMLIMIT chosen: never held":            {500000, 224 * mi, 0, false, true},
		"no limit at all":                          {500000, 0, 0, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			hold, warn, need := listVerdict(tc.nodes, tc.soft, tc.container)
			if hold != tc.hold || warn != tc.warn {
				t.Errorf("listVerdict(%d nodes, soft %d MiB, container %d MiB) = hold %v, warn %v (need %d MiB), want hold %v, warn %v",
					tc.nodes, tc.soft/mi, tc.container/mi, hold, warn, need/mi, tc.hold, tc.warn)
			}
		})
	}
}
