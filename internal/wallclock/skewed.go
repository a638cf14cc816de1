//go:build clockskew

package wallclock

import (
	"time"

	"k8s.io/utils/clock"
)

// Skew is how far ahead Real runs under the clockskew tag: far enough that
// every fixed date a test builds from the calendar has aged past any of the
// product's windows (remembered pools, caches, heartbeats).
const Skew = 366 * 24 * time.Hour

var realClock clock.WithTicker = skewed{}

// skewed reads the real clock a year ahead; its timers and tickers wait
// real durations, which a skew does not change.
type skewed struct{ clock.RealClock }

func (skewed) Now() time.Time                    { return time.Now().Add(Skew) }
func (s skewed) Since(t time.Time) time.Duration { return s.Now().Sub(t) }
