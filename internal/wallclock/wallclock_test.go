package wallclock

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestOr(t *testing.T) {
	fake := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	if got := Or(fake); got != fake {
		t.Fatalf("Or(fake) = %v, want the fake", got)
	}
	if Or(nil) != Real() {
		t.Fatal("Or(nil) is not Real")
	}
}
