package layout

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationStaleDriver is the node's GPU containers that still map a driver
// library deleted on disk (StaleDriver, JSON): what a driver upgrade leaves
// running until those pods restart. The probe publishes it from the NRI
// plugin's scan while the plugin is registered and scans.
const AnnotationStaleDriver = Prefix + "stale-driver"

// Bounds of StaleDriver: the annotation names at most MaxStalePods pods,
// each namespace/name at most 253+1+253 bytes.
const (
	MaxStalePods        = 20
	maxStaleDriverBytes = 16 << 10
)

// StaleDriver is the NRI plugin's last scan of its node's GPU containers.
type StaleDriver struct {
	// CheckedAt is when a scan first found what the record says.
	CheckedAt time.Time `json:"checkedAt"`
	// Containers is the GPU containers scanned.
	Containers int `json:"containers"`
	// StaleContainers of them map a deleted driver library.
	StaleContainers int `json:"staleContainers"`
	// StalePods is how many pods those belong to; Pods names the first
	// MaxStalePods (namespace/name, sorted).
	StalePods int      `json:"stalePods"`
	Pods      []string `json:"pods,omitempty"`
	// Unreadable is the GPU containers whose processes' maps the plugin may
	// not read (no ptrace-read access): they may be stale too.
	Unreadable int `json:"unreadable,omitempty"`
}

// EncodeStaleDriver is the annotation's value.
func EncodeStaleDriver(s StaleDriver) (string, error) {
	if len(s.Pods) > MaxStalePods {
		s.Pods = s.Pods[:MaxStalePods]
	}
	data, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("failed to encode the stale driver record: %w", err)
	}
	return string(data), nil
}

// DecodeStaleDriver reads the annotation, which a node wrote: bounded, every
// count non-negative, every pod a namespace/name, at most MaxStalePods.
func DecodeStaleDriver(v string) (StaleDriver, error) {
	var s StaleDriver
	if len(v) > maxStaleDriverBytes {
		return s, fmt.Errorf("failed to decode %s: %d bytes, more than %d", AnnotationStaleDriver, len(v), maxStaleDriverBytes)
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return StaleDriver{}, fmt.Errorf("failed to decode %s: %w", AnnotationStaleDriver, err)
	}
	switch {
	case s.Containers < 0 || s.StaleContainers < 0 || s.StalePods < 0 || s.Unreadable < 0:
		return StaleDriver{}, fmt.Errorf("failed to decode %s: a negative count", AnnotationStaleDriver)
	case len(s.Pods) > MaxStalePods || len(s.Pods) > s.StalePods:
		return StaleDriver{}, fmt.Errorf("failed to decode %s: %d pods named, %d stale", AnnotationStaleDriver, len(s.Pods), s.StalePods)
	}
	for _, p := range s.Pods {
		ns, name, ok := strings.Cut(p, "/")
		// The API server's own rules for the two: no control character, no
		// space, nothing a terminal would take for a command.
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return StaleDriver{}, fmt.Errorf("failed to decode %s: %q is no namespace/name", AnnotationStaleDriver, Truncate(p, 64))
		}
	}
	if !slices.IsSorted(s.Pods) {
		slices.Sort(s.Pods)
	}
	return s, nil
}
