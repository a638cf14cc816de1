//go:build !clockskew

package wallclock

import "k8s.io/utils/clock"

var realClock clock.WithTicker = clock.RealClock{}
