package nodeprobe

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// folderKind says how the allowlist lets a host folder be mounted.
type folderKind int

const (
	// folderDedicated may be mounted whole: the driver's own folder.
	folderDedicated folderKind = iota
	// folderShared allows driver files one by one, never the folder.
	folderShared
	// folderForbidden is outside the allowlist; nothing in it is mounted.
	folderForbidden
)

// classify asks the configured allowlist, so that the probe never plans a
// mount the webhook would reject.
func classify(rules layout.Rules, dir, sample string) folderKind {
	probe := func(m layout.Mount) bool {
		p := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "0", Mounts: []layout.Mount{m}}
		return len(p.Validate(rules)) == 0
	}
	if probe(layout.Mount{HostPath: dir, ContainerPath: rules.ContainerPathRoots[0], Kind: layout.KindDirectory}) {
		return folderDedicated
	}
	if probe(layout.Mount{HostPath: path.Join(dir, sample), ContainerPath: path.Join(rules.ContainerPathRoots[0], sample), Kind: layout.KindFile}) {
		return folderShared
	}
	return folderForbidden
}

// PlanError is a discovery outcome that yields no usable plan.
type PlanError struct {
	Condition Condition
	Message   string
}

func (e *PlanError) Error() string { return string(e.Condition) + ": " + e.Message }

// BuildPlan turns the files of one driver version into a mount plan:
//
//   - each library is taken once, from a dedicated folder rather than a shared one;
//   - when one dedicated folder holds every library, it is mounted whole at the
//     container library folder; otherwise every library is mounted file by file,
//     under its versioned name and under each SONAME, always from the real file;
//   - binaries follow the same rule at the container binary folder, and only
//     from a dedicated folder that belongs to this driver (beside its libraries)
//     or from a shared one.
//
// notes says what was left out and why.
func BuildPlan(files *Files, version, cudaVersion string, cfg *config.Configuration) (plan layout.Plan, notes []string, err error) {
	rules := cfg.Rules()
	libDir, binDir := cfg.ContainerPaths.LibraryDir, cfg.ContainerPaths.BinaryDir
	kinds := map[string]folderKind{}
	kindOf := func(p string) folderKind {
		d := path.Dir(p)
		k, ok := kinds[d]
		if !ok {
			k = classify(rules, d, path.Base(p))
			kinds[d] = k
		}
		return k
	}

	// One library per name, best folder first; Discover's order breaks ties.
	chosen := map[string]Library{}
	var names []string
	for _, l := range files.Libraries {
		if l.Version != version {
			continue
		}
		k := kindOf(l.Path)
		if k == folderForbidden {
			notes = append(notes, fmt.Sprintf("%s: outside the host path allowlist", l.Path))
			continue
		}
		prev, ok := chosen[l.Name]
		if !ok {
			names = append(names, l.Name)
		}
		if !ok || k < kindOf(prev.Path) {
			if ok {
				notes = append(notes, fmt.Sprintf("%s: duplicate of %s", prev.Path, l.Path))
			}
			chosen[l.Name] = l
		} else {
			notes = append(notes, fmt.Sprintf("%s: duplicate of %s", l.Path, prev.Path))
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		return plan, notes, &PlanError{ConditionDriverFilesNotFound, fmt.Sprintf("no driver library of version %s under the host root", version)}
	}
	for _, base := range RequiredLibraries {
		if _, ok := chosen[base+".so."+version]; !ok {
			return plan, notes, &PlanError{ConditionRequiredLibraryMissing, fmt.Sprintf("%s.so.%s not found", base, version)}
		}
	}

	plan = layout.Plan{
		SchemaVersion:     layout.SchemaVersion,
		DriverVersion:     version,
		CUDADriverVersion: cudaVersion,
		LibraryPaths:      []string{libDir},
	}
	libFolders := map[string]bool{}
	for _, n := range names {
		libFolders[path.Dir(chosen[n].Path)] = true
	}
	if d, ok := single(libFolders); ok && kindOf(chosen[names[0]].Path) == folderDedicated {
		plan.Mounts = append(plan.Mounts, layout.Mount{HostPath: d, ContainerPath: libDir, Kind: layout.KindDirectory})
	} else {
		for _, n := range names {
			l := chosen[n]
			for _, as := range append([]string{l.Name}, l.SONAMEs...) {
				plan.Mounts = appendMount(plan.Mounts, layout.Mount{HostPath: l.Path, ContainerPath: path.Join(libDir, as), Kind: layout.KindFile})
			}
		}
	}

	// Binaries: a dedicated folder counts only if libraries of this version
	// sit beside it (D/bin next to D, D/lib64 or D/lib), so that nvidia-384/bin
	// is never paired with the 390 libraries.
	ownBinFolder := func(d string) bool {
		parent := path.Dir(d)
		for _, l := range files.Libraries {
			if l.Version != version {
				continue
			}
			switch path.Dir(l.Path) {
			case parent, path.Join(parent, "lib64"), path.Join(parent, "lib"):
				return true
			}
		}
		return false
	}
	bins := map[string]Binary{}
	var binNames []string
	for _, b := range files.Binaries {
		k := kindOf(b.Path)
		switch {
		case k == folderForbidden:
			notes = append(notes, fmt.Sprintf("%s: outside the host path allowlist", b.Path))
			continue
		case k == folderDedicated && !ownBinFolder(path.Dir(b.Path)):
			notes = append(notes, fmt.Sprintf("%s: belongs to another driver folder", b.Path))
			continue
		}
		prev, ok := bins[b.Name]
		if !ok {
			binNames = append(binNames, b.Name)
			bins[b.Name] = b
		} else if k < kindOf(prev.Path) {
			bins[b.Name] = b
		}
	}
	sort.Strings(binNames)
	binFolders := map[string]bool{}
	for _, n := range binNames {
		binFolders[path.Dir(bins[n].Path)] = true
	}
	if d, ok := single(binFolders); ok && kindOf(bins[binNames[0]].Path) == folderDedicated {
		plan.Mounts = append(plan.Mounts, layout.Mount{HostPath: d, ContainerPath: binDir, Kind: layout.KindDirectory})
	} else {
		for _, n := range binNames {
			plan.Mounts = appendMount(plan.Mounts, layout.Mount{HostPath: bins[n].Path, ContainerPath: path.Join(binDir, n), Kind: layout.KindFile})
		}
	}

	plan.Normalize()
	if errs := plan.Validate(rules); len(errs) > 0 {
		return plan, notes, &PlanError{ConditionPlanInvalid, errs.ToAggregate().Error()}
	}
	return plan, notes, nil
}

func single(set map[string]bool) (string, bool) {
	if len(set) != 1 {
		return "", false
	}
	for k := range set {
		return k, true
	}
	return "", false
}

// appendMount skips a second mount at the same container path: a SONAME equal
// to the file name, or two libraries claiming one SONAME (first wins).
func appendMount(ms []layout.Mount, m layout.Mount) []layout.Mount {
	for _, x := range ms {
		if x.ContainerPath == m.ContainerPath {
			return ms
		}
	}
	return append(ms, m)
}

// kernelModuleVersion reads the loaded kernel module's version from the host's
// /sys or /proc, which needs no device access; "" when unknown.
func kernelModuleVersion(h hostFS) string {
	if data, err := h.readFile("/sys/module/nvidia/version"); err == nil {
		if v := strings.TrimSpace(string(data)); versionRE.MatchString(v) {
			return v
		}
	}
	if data, err := h.readFile("/proc/driver/nvidia/version"); err == nil {
		// NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ...
		for _, f := range strings.Fields(string(data)) {
			if versionRE.MatchString(f) {
				return f
			}
		}
	}
	return ""
}
