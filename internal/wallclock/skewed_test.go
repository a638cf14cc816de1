//go:build clockskew

package wallclock

import (
	"testing"
	"time"
)

func TestRealIsAhead(t *testing.T) {
	if d := Real().Now().Sub(time.Now()); d < Skew-time.Minute {
		t.Fatalf("Real runs %v ahead under clockskew, want %v", d, Skew)
	}
}
