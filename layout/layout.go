// Package layout is the contract between the node probe, which publishes where a
// node's NVIDIA driver lives, and the webhook, which injects it into pods. It is
// the only code the two share; docs/layout-contract.md is its reference page.
package layout

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// Prefix is the prefix of every label and annotation this project owns.
const Prefix = "gpu-injector.io/"

// Keys published on Nodes by the probe.
const (
	// AnnotationLayout holds the Plan, JSON-encoded.
	AnnotationLayout = Prefix + "layout"
	// LabelFingerprint is Plan.Fingerprint(); the webhook pins pods to it.
	LabelFingerprint = Prefix + "layout-fingerprint"
	// LabelState is StateReady, StateError, StateNoDriver or StateWedged.
	LabelState = Prefix + "state"
	// AnnotationStateReason says why LabelState is not StateReady.
	AnnotationStateReason = Prefix + "state-reason"

	LabelDriverVersion     = Prefix + "driver-version"
	LabelCUDADriverVersion = Prefix + "cuda-driver-version"
	LabelGPUProduct        = Prefix + "gpu-product"
	LabelGPUCount          = Prefix + "gpu-count"
	LabelGPUMemoryMiB      = Prefix + "gpu-memory-mib"
	LabelComputeCapability = Prefix + "compute-capability"
	LabelMIGEnabled        = Prefix + "mig-enabled"
)

// LabelCUDADriverVersionNumber is the CUDA driver version as one integer
// (CUDAVersionNumber: 12040 for 12.4), published by the probe beside
// LabelCUDADriverVersion, so that a nodeAffinity Gt or Lt term can compare
// it: label values are text, and Gt and Lt read integers only.
const LabelCUDADriverVersionNumber = Prefix + "cuda-driver-version-number"

// Keys users and the webhook put on Namespaces and Pods.
const (
	// LabelInject on a Namespace opts it in with the value InjectEnabled.
	LabelInject   = Prefix + "inject"
	InjectEnabled = "enabled"
	// AnnotationInject on a Pod with the value "false" opts the pod out.
	AnnotationInject = Prefix + "inject"
	// AnnotationInjected marks a pod the webhook changed; its value is an
	// Injected record, so a reinvocation can tell its own work apart.
	AnnotationInjected = Prefix + "injected"
	// AnnotationCUDARequirement on a Pod replaces what its images require of
	// the driver when the webhook steers it by CUDA version: a requirement
	// in NVIDIA's syntax (cuda>=12.6), or "none" to not steer it. A framework
	// installed with pip may need more than its image's label says.
	AnnotationCUDARequirement = Prefix + "cuda-requirement"
	// LabelPinnedLayout on a Pod pinned by its pool's labels (not by the
	// fingerprint) holds the fingerprint injected, so that a pod that landed on
	// a node of the pool with another layout can be found and told.
	LabelPinnedLayout = Prefix + "pinned-layout"
	// LabelAdmission on a Pod with the value AdmissionPolicy marks a pod the
	// chart's MutatingAdmissionPolicy admitted. The webhook's objectSelector
	// leaves such pods out, which the API server decides on the labels alone,
	// before it converts the pod for any condition. A pod author who writes
	// it opts the pod out of the webhook, as AnnotationInject "false" does.
	LabelAdmission  = Prefix + "admission"
	AdmissionPolicy = "policy"
)

// Node states.
const (
	StateReady = "ready"
	StateError = "error"
	// StateNoDriver is a node with no NVIDIA device and no driver: not a
	// failure, so the probe can run on every node and say so cheaply.
	StateNoDriver = "no-driver"
	// StateWedged is a node whose driver is installed but does not work: an
	// NVML call did not return within the probe's limit, or NVML reports a GPU
	// lost or in need of a reset. Only a GPU reset or a reboot helps, so no
	// GPU pod should be sent there; the probe clears it once NVML answers.
	StateWedged = "wedged"
)

// Runtime injection: something on the node other than gpu-injector already
// puts the driver into GPU containers, so the webhook must pin pods there
// without adding mounts (two mounts at one path break the container).
const (
	// RuntimeToolkit is the NVIDIA container toolkit as the default runtime.
	RuntimeToolkit = "toolkit"
	// RuntimeCDI is a CDI spec for nvidia.com/gpu (written by the toolkit's
	// generator or by a DRA driver) that the runtime applies.
	RuntimeCDI = "cdi"
	// RuntimeDevicePlugin is a device plugin whose Allocate answer mounts the
	// driver folder into every container that gets a GPU (GKE's
	// nvidia-gpu-device-plugin: /home/kubernetes/bin/nvidia at
	// /usr/local/nvidia); the kubelet adds those mounts, not the runtime.
	RuntimeDevicePlugin = "device-plugin"
)

// Runtime injection by gpu-injector's own NRI plugin: the webhook marks
// which containers want the driver, and the plugin, running beside the probe
// on every GPU node, adds the node's own mounts when the runtime creates them.
// The marker never says what to mount: host paths come only from the node's
// discovery.
const (
	// LabelNRIPlugin on a Node says its probe's NRI plugin is registered with
	// the container runtime, so the node injects the driver at container
	// creation. Its value is the marker protocol the plugin serves
	// (NRIProtocol); absent means no plugin, or one that is not registered.
	LabelNRIPlugin = Prefix + "nri-plugin"

	// LabelDriverMounts on a Node says how a driver that its host mounts
	// after the probe started (the GPU operator's driver container at
	// /run/nvidia/driver) reaches the probe: DriverMountsPropagated, the
	// probe's copy of the host's mounts follows the host's, and the driver
	// watch sees it at once; DriverMountsRestart, the probe compares the
	// host's mount table with its own and restarts its container when they
	// differ, within about 10 seconds and the kubelet's restart.
	LabelDriverMounts      = Prefix + "driver-mounts"
	DriverMountsPropagated = "propagated"
	DriverMountsRestart    = "restart"
	// NRIProtocol is the version of AnnotationRuntimeInject this code reads
	// and writes.
	NRIProtocol = "v1"
	// AnnotationRuntimeInject on a Pod lists, comma-separated, the containers
	// the plugin gives the node's driver (FormatRuntimeMarker). Only the
	// webhook should write it; the plugin still requires that the kubelet gave
	// the container a GPU.
	AnnotationRuntimeInject = Prefix + "runtime-inject"
	// NRIPluginName is the name the plugin registers with the runtime, and the
	// name the webhook lists in NRI's required-plugins annotation.
	NRIPluginName = "gpu-injector"
	// AnnotationNRIRequiredPlugins is the NRI default validator's annotation
	// (containerd 2.2+ with the validator enabled): a container it names (the
	// key's "/container.<name>" form) is not created unless every listed
	// plugin is registered, so a pod admitted for runtime injection never
	// starts without its driver where the runtime supports it.
	AnnotationNRIRequiredPlugins = "required-plugins.noderesource.dev"
)

// MaxRuntimeMarkerBytes bounds a marker: a pod has at most a few hundred
// containers, each named by a DNS label.
const MaxRuntimeMarkerBytes = 16 << 10

// FormatRuntimeMarker is the AnnotationRuntimeInject value for containers.
func FormatRuntimeMarker(containers []string) string {
	return strings.Join(containers, ",")
}

// ParseRuntimeMarker reads an AnnotationRuntimeInject value. The value is the
// pod's, so anyone who writes the pod may have written it: every name must be
// a container name (a DNS label), none twice, the whole within
// MaxRuntimeMarkerBytes.
func ParseRuntimeMarker(s string) ([]string, error) {
	if len(s) > MaxRuntimeMarkerBytes {
		return nil, fmt.Errorf("failed to read the runtime injection marker: %d bytes exceeds the limit of %d", len(s), MaxRuntimeMarkerBytes)
	}
	if s == "" {
		return nil, fmt.Errorf("failed to read the runtime injection marker: it names no container")
	}
	names := strings.Split(s, ",")
	seen := make(map[string]bool, len(names))
	for _, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, fmt.Errorf("failed to read the runtime injection marker: %q is not a container name: %s", Truncate(n, 64), strings.Join(errs, "; "))
		}
		if seen[n] {
			return nil, fmt.Errorf("failed to read the runtime injection marker: container %q is listed twice", n)
		}
		seen[n] = true
	}
	return names, nil
}

// RuntimeInjections are the values of Plan.RuntimeInjection a node may publish,
// besides "" for a plan of mounts.
var RuntimeInjections = []string{RuntimeToolkit, RuntimeCDI, RuntimeDevicePlugin}

// SchemaVersion is the only Plan schema this code reads and writes.
const SchemaVersion = "v1"

// MaxAnnotationBytes bounds what Decode accepts; a real plan is ~2 KiB and
// Kubernetes caps all annotations of an object at 256 KiB together.
const MaxAnnotationBytes = 64 << 10

// MountKind says whether a host path is a folder or a single file, and maps
// onto the hostPath volume type, so the kubelet refuses a path that changed kind.
type MountKind string

const (
	KindDirectory MountKind = "Directory"
	KindFile      MountKind = "File"
)

// Mount is one read-only hostPath to bind into GPU containers.
type Mount struct {
	HostPath      string    `json:"hostPath"`
	ContainerPath string    `json:"containerPath"`
	Kind          MountKind `json:"kind"`
}

// Plan is everything a node publishes about its driver layout.
type Plan struct {
	SchemaVersion     string  `json:"schemaVersion"`
	DriverVersion     string  `json:"driverVersion"`
	CUDADriverVersion string  `json:"cudaDriverVersion,omitempty"`
	Mounts            []Mount `json:"mounts"`
	// LibraryPaths are container folders to add to LD_LIBRARY_PATH, in order.
	LibraryPaths []string `json:"libraryPaths"`
	// RuntimeInjection is one of RuntimeInjections when something on the node
	// (its runtime, its device plugin) injects the driver itself; such a plan
	// has no mounts. Only a RuntimeDevicePlugin plan may have library paths:
	// the folders the plugin's own mount puts the libraries in, which it does
	// not put on LD_LIBRARY_PATH (the toolkit runs ldconfig in the container).
	RuntimeInjection string `json:"runtimeInjection,omitempty"`
}

// Normalize sorts mounts by container path so that two probes that found the
// same files in a different order publish the same bytes and fingerprint.
func (p *Plan) Normalize() {
	sort.SliceStable(p.Mounts, func(i, j int) bool {
		if p.Mounts[i].ContainerPath != p.Mounts[j].ContainerPath {
			return p.Mounts[i].ContainerPath < p.Mounts[j].ContainerPath
		}
		return p.Mounts[i].HostPath < p.Mounts[j].HostPath
	})
}

// Encode returns the annotation value of a plan, normalized.
func Encode(p Plan) (string, error) {
	p.Mounts = append([]Mount(nil), p.Mounts...)
	p.Normalize()
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("failed to encode layout: %w", err)
	}
	return string(b), nil
}

// Decode parses an annotation value strictly (UnmarshalStrict): unknown,
// duplicate and case-folded fields, trailing data, oversize input and a
// foreign schema version are errors, because the value comes from a node
// agent and the webhook is the trust boundary.
func Decode(s string) (Plan, error) {
	var p Plan
	if len(s) > MaxAnnotationBytes {
		return p, fmt.Errorf("failed to decode layout: %d bytes exceeds the limit of %d", len(s), MaxAnnotationBytes)
	}
	if err := UnmarshalStrict([]byte(s), &p); err != nil {
		return Plan{}, fmt.Errorf("failed to decode layout: %w", err)
	}
	if p.SchemaVersion != SchemaVersion {
		return Plan{}, fmt.Errorf("failed to decode layout: unsupported schemaVersion %q, want %q", p.SchemaVersion, SchemaVersion)
	}
	return p, nil
}

// UnmarshalStrict decodes JSON that a node or a pod wrote so that every JSON
// reader reads it alike: one value and nothing after it, no key twice, every
// key spelled exactly as the field it sets, and no key v does not know.
// encoding/json matches keys case-insensitively (Unicode folding: "ſ" is
// "s") and lets the last of two equal keys win, so a value that breaks these
// rules could mean one plan to the webhook and another to any other reader.
func UnmarshalStrict(data []byte, v any) error {
	return unmarshalStrict(data, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
}

func unmarshalStrict(data []byte, v any, opts ...kjson.StrictOption) error {
	// The first value's end, for an error that says what is wrong: the
	// strict decoder would only call the next byte invalid.
	dec := json.NewDecoder(bytes.NewReader(data))
	var first json.RawMessage
	if err := dec.Decode(&first); err != nil {
		return err
	}
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
		return errors.New("trailing data after the JSON value")
	}
	strict, err := kjson.UnmarshalStrict(data, v, opts...)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// Fingerprint is a short hash of the normalized plan, valid as a label value.
// Equal plans have equal fingerprints on every node; any change of driver
// version or of a path gives a new one.
func (p Plan) Fingerprint() string {
	s, err := Encode(p)
	if err != nil {
		// Encode fails only on values json cannot represent; Plan has none.
		panic(err)
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:10])
}

// AllowedPath is one entry of the host path allowlist.
type AllowedPath struct {
	// Path is an absolute, clean path; its last element may be a path.Match
	// pattern such as /usr/lib/nvidia-*.
	Path string `json:"path"`
	// FilesOnly allows only File mounts directly inside Path whose name matches
	// one of the driver file patterns: for shared system folders such as
	// /usr/lib/x86_64-linux-gnu, which must never be mounted whole.
	FilesOnly bool `json:"filesOnly,omitempty"`
}

// Rules are what Validate checks a plan against.
type Rules struct {
	HostPathAllowlist []AllowedPath
	// DriverFilePatterns are path.Match patterns of file names allowed in a
	// FilesOnly folder.
	DriverFilePatterns []string
	// ContainerPathRoots are the only container folders mounts may target.
	ContainerPathRoots []string
}

// MaxMounts bounds a plan; a real driver needs about 40 loose files at most.
const MaxMounts = 128

// Validate reports every rule a plan breaks, each naming its field.
func (p Plan) Validate(r Rules) field.ErrorList {
	var errs field.ErrorList
	root := field.NewPath("layout")
	if p.SchemaVersion != SchemaVersion {
		errs = append(errs, field.NotSupported(root.Child("schemaVersion"), p.SchemaVersion, []string{SchemaVersion}))
	}
	if p.DriverVersion == "" {
		errs = append(errs, field.Required(root.Child("driverVersion"), "the driver version the files belong to"))
	}
	// Versions end up in labels, warnings and denial messages: keep them short
	// and printable, whatever a node publishes.
	for name, v := range map[string]string{"driverVersion": p.DriverVersion, "cudaDriverVersion": p.CUDADriverVersion} {
		if v != "" && !versionRE.MatchString(v) {
			errs = append(errs, field.Invalid(root.Child(name), Truncate(v, 64), "must be a version like 580.159.04: digits, letters, '.', '-' or '_', at most 63 characters"))
		}
	}
	switch p.RuntimeInjection {
	case "":
		if len(p.Mounts) == 0 {
			errs = append(errs, field.Required(root.Child("mounts"), "at least one mount"))
		}
	case RuntimeToolkit, RuntimeCDI:
		if len(p.Mounts) != 0 || len(p.LibraryPaths) != 0 {
			errs = append(errs, field.Forbidden(root.Child("mounts"), "a node whose runtime injects the driver publishes no mounts and no library paths"))
		}
	case RuntimeDevicePlugin:
		// GKE's device plugin mounts the driver folder but sets no
		// LD_LIBRARY_PATH: the library paths say where its mount puts the
		// libraries. They are checked below like a mounted layout's.
		if len(p.Mounts) != 0 {
			errs = append(errs, field.Forbidden(root.Child("mounts"), "a node whose device plugin injects the driver publishes no mounts"))
		}
	default:
		errs = append(errs, field.NotSupported(root.Child("runtimeInjection"), Truncate(p.RuntimeInjection, 64), RuntimeInjections))
	}
	if len(p.Mounts) > MaxMounts {
		errs = append(errs, field.TooMany(root.Child("mounts"), len(p.Mounts), MaxMounts))
	}
	seen := make(map[string]bool, len(p.Mounts))
	for i, m := range p.Mounts {
		fp := root.Child("mounts").Index(i)
		if m.Kind != KindDirectory && m.Kind != KindFile {
			errs = append(errs, field.NotSupported(fp.Child("kind"), string(m.Kind), []string{string(KindDirectory), string(KindFile)}))
		}
		if err := checkAbsClean(m.HostPath); err != "" {
			errs = append(errs, field.Invalid(fp.Child("hostPath"), Truncate(m.HostPath, 256), err))
		} else if el := kernelElement(m.HostPath); el != "" {
			errs = append(errs, field.Forbidden(fp.Child("hostPath"), fmt.Sprintf("%q has a %q element: a view of the host's processes, devices or kernel (e.g. /proc/1/root is the host's /) is never a driver folder", m.HostPath, el)))
		} else if !hostPathAllowed(m.HostPath, m.Kind, r) {
			errs = append(errs, field.Forbidden(fp.Child("hostPath"), fmt.Sprintf("%q is not under the host path allowlist", m.HostPath)))
		}
		if err := checkAbsClean(m.ContainerPath); err != "" {
			errs = append(errs, field.Invalid(fp.Child("containerPath"), Truncate(m.ContainerPath, 256), err))
		} else if !underAny(m.ContainerPath, r.ContainerPathRoots, m.Kind == KindDirectory) {
			errs = append(errs, field.Forbidden(fp.Child("containerPath"), fmt.Sprintf("%q is not under the container mount points %v", m.ContainerPath, r.ContainerPathRoots)))
		}
		if seen[m.ContainerPath] {
			errs = append(errs, field.Duplicate(fp.Child("containerPath"), m.ContainerPath))
		}
		seen[m.ContainerPath] = true
	}
	for i, lp := range p.LibraryPaths {
		fp := root.Child("libraryPaths").Index(i)
		if err := checkAbsClean(lp); err != "" {
			errs = append(errs, field.Invalid(fp, Truncate(lp, 256), err))
		} else if strings.ContainsAny(lp, ":") {
			errs = append(errs, field.Invalid(fp, lp, "must not contain ':'"))
		} else if !underAny(lp, r.ContainerPathRoots, true) {
			errs = append(errs, field.Forbidden(fp, fmt.Sprintf("%q is not under the container mount points %v", lp, r.ContainerPathRoots)))
		}
	}
	return errs
}

var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._-]{0,62}$`)

// Truncate cuts text a node published to n bytes (and "..."), so that a
// message quoting it stays short whatever the node wrote.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// kernelElement finds a proc, sys or dev element anywhere in p: below an
// allowlisted folder these can only be a bind of the host's own /proc, /sys
// or /dev (the GPU operator binds the host's / under /run/nvidia/driver).
func kernelElement(p string) string {
	for _, el := range strings.Split(p, "/") {
		switch el {
		case "proc", "sys", "dev":
			return el
		}
	}
	return ""
}

func checkAbsClean(p string) string {
	switch {
	case p == "":
		return "must not be empty"
	case !path.IsAbs(p):
		return "must be an absolute path"
	case strings.ContainsAny(p, "\x00\n"):
		return "must not contain NUL or newline"
	case path.Clean(p) != p:
		return "must be a clean path (no '..', '.', '//' or trailing '/')"
	case p == "/":
		return "must not be the root folder"
	}
	return ""
}

// underAny reports whether p is one of roots or below one; the root itself
// counts only when allowSelf is set.
func underAny(p string, roots []string, allowSelf bool) bool {
	for _, r := range roots {
		if p == r && allowSelf {
			return true
		}
		if strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

func hostPathAllowed(p string, kind MountKind, r Rules) bool {
	for _, a := range r.HostPathAllowlist {
		if a.FilesOnly {
			if kind != KindFile {
				continue
			}
			dir, name := path.Split(p)
			if ok, _ := path.Match(a.Path, path.Clean(dir)); !ok {
				continue
			}
			for _, pat := range r.DriverFilePatterns {
				if ok, _ := path.Match(pat, name); ok {
					return true
				}
			}
			continue
		}
		// p or one of its ancestors must match the entry.
		for q := p; q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(a.Path, q); ok {
				return true
			}
		}
	}
	return false
}

// Injected is the value of AnnotationInjected on a mutated pod.
type Injected struct {
	Fingerprint   string   `json:"fingerprint,omitempty"`
	StaticLayout  string   `json:"staticLayout,omitempty"`
	DriverVersion string   `json:"driverVersion"`
	Containers    []string `json:"containers"`
	Volumes       []string `json:"volumes,omitempty"`

	// Pool is the pool the pod is pinned to (its labels, k=v,...), when pinned
	// by pool; the pools, separated by a space, when pinned to several pools
	// of one layout; Remembered says the pool had no node and the layout came from
	// memory or from the pool's declaration in the configuration.
	Pool       string `json:"pool,omitempty"`
	Remembered bool   `json:"remembered,omitempty"`

	// Runtime is InjectedByNRI for a pod whose driver the node's NRI plugin
	// adds at container creation: no volumes, no pin, no driver version (the
	// node the pod lands on decides).
	Runtime string `json:"runtime,omitempty"`
}

// InjectedByNRI is Injected.Runtime for runtime injection.
const InjectedByNRI = "nri"

// injectedKeys are the JSON keys of Injected.
var injectedKeys = jsonKeys(reflect.TypeFor[Injected]())

func jsonKeys(t reflect.Type) []string {
	var keys []string
	for f := range t.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// ParseInjected reads an AnnotationInjected value. The value is the pod's, so
// anyone who writes the pod may have written it: an error says what is wrong
// with it, for a warning the pod's author can act on. Fields of a newer
// record are ignored, so that a rollback still reads it; a key twice, or a
// key that is one of the record's in another case, is an error, as it would
// read differently elsewhere (UnmarshalStrict).
func ParseInjected(s string) (Injected, error) {
	var i Injected
	if len(s) > MaxAnnotationBytes {
		return Injected{}, fmt.Errorf("failed to read the injection record: %d bytes exceeds the limit of %d", len(s), MaxAnnotationBytes)
	}
	// Every key, known or not, at any depth, once; then the record's own.
	var fields map[string]any
	if err := unmarshalStrict([]byte(s), &fields, kjson.DisallowDuplicateFields); err != nil {
		return Injected{}, fmt.Errorf("failed to read the injection record as JSON: %w", err)
	}
	for k := range fields {
		for _, known := range injectedKeys {
			if k != known && strings.EqualFold(k, known) {
				return Injected{}, fmt.Errorf("failed to read the injection record: key %q is %q spelled in another case", Truncate(k, 64), known)
			}
		}
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts([]byte(s), &i); err != nil {
		return Injected{}, fmt.Errorf("failed to read the injection record as JSON: %w", err)
	}
	named := 0
	for _, v := range []string{i.Fingerprint, i.StaticLayout, i.Runtime} {
		if v != "" {
			named++
		}
	}
	if named != 1 {
		return Injected{}, fmt.Errorf("failed to read the injection record: it must name exactly one of fingerprint, staticLayout and runtime")
	}
	if i.Runtime != "" && i.Runtime != InjectedByNRI {
		return Injected{}, fmt.Errorf("failed to read the injection record: runtime %q is not %q", Truncate(i.Runtime, 64), InjectedByNRI)
	}
	return i, nil
}

// String encodes the record compactly and deterministically.
func (i Injected) String() string { return compactJSON(i) }

// compactJSON encodes a record of this package, which always encodes: one
// line, with no HTML escaping, so that a value reads as written.
func compactJSON(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSpace(b.String())
}

// CUDAVersionNumber encodes a CUDA version "major.minor" as NVIDIA's driver
// API does (cuDriverGetVersion, nvmlSystemGetCudaDriverVersion): 1000*major +
// 10*minor, so 12.4 is 12040 and 9.2 is 9020. ok is false for anything else,
// or a minor of 100 or more, which the encoding cannot hold.
func CUDAVersionNumber(v string) (n int, ok bool) {
	major, minor, found := strings.Cut(v, ".")
	if !found || !digits(major, 6) || !digits(minor, 2) {
		return 0, false
	}
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	return 1000*ma + 10*mi, true
}

// digits reports whether s is 1 to max ASCII digits.
func digits(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// CompareVersions compares dotted versions numerically (driver 535.104.05 <
// 580.159.04, compute capability 8.6 < 9.0), falling back to text for parts
// that are not numbers.
func CompareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y string
		if i < len(as) {
			x = as[i]
		}
		if i < len(bs) {
			y = bs[i]
		}
		xi, errx := strconv.Atoi(x)
		yi, erry := strconv.Atoi(y)
		switch {
		case errx == nil && erry == nil && xi != yi:
			if xi < yi {
				return -1
			}
			return 1
		case (errx != nil || erry != nil) && x != y:
			return strings.Compare(x, y)
		}
	}
	return 0
}
