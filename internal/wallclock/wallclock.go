// Package wallclock is the one place product code gets the real clock from.
// Product code takes a clock (k8s.io/utils/clock) and falls back to Real
// when its caller sets none; tests set a fake one. Built with the tag
// clockskew, Real runs a year ahead (skewed.go), so that a test which builds
// fixed dates but leaves some product path on the real clock fails on any
// day, not only on the day the dates age out: `make test`'s unit stage runs
// the packages whose tests build fixed dates that way.
package wallclock

import "k8s.io/utils/clock"

// Real returns the clock product code reads when its caller sets none.
func Real() clock.WithTicker { return realClock }

// Or returns c, or Real when c is nil.
func Or(c clock.PassiveClock) clock.PassiveClock {
	if c == nil {
		return Real()
	}
	return c
}
