// Package version holds the build's version, stamped by the linker:
// -ldflags "-X github.com/gpu-injector/gpu-injector/version.Version=v0.1.0".
package version

import "runtime/debug"

// Version is the release; "dev" for a build that was not stamped.
var Version = "dev"

// String says the version and the VCS revision when the build knows it.
func String() string {
	rev := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " (" + s.Value[:12] + ")"
			}
		}
	}
	return Version + rev
}
