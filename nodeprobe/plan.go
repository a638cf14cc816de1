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

// maxDedicatedEntries bounds a folder that may be mounted whole: a driver's own
// folder holds a few dozen files, a system folder thousands.
const maxDedicatedEntries = 400

// driverOnly reports whether a folder holds nothing but this driver version's
// files, so that mounting it whole gives a container nothing else of the
// host; why names the first file that says otherwise. It looks one level of
// subfolders deep (xorg/, vdpau/, tls/ of a driver folder) and judges names
// and file modes only:
//
//   - a versioned NVIDIA library of another driver version (a leftover of an
//     upgrade, a second driver) makes the folder mixed;
//   - so does any shared library or program not named for NVIDIA or CUDA
//     (libc, libz, ls), except the few loaders the driver's installer ships
//     beside its own libraries (libOpenCL, libGL*, libEGL*, libGLES*,
//     libOpenGL, libvdpau);
//   - data files (README, .json, .bin firmware, man pages) and links are fine:
//     a link in a mounted folder resolves inside the container, not the host.
func driverOnly(h hostFS, dir, version string, depth int) (ok bool, why string) {
	if config.IsSystemFolder(dir) {
		return false, dir + " is a system folder"
	}
	des, err := h.readDir(dir)
	if err != nil {
		return false, err.Error()
	}
	if len(des) > maxDedicatedEntries {
		return false, fmt.Sprintf("%s holds %d entries", dir, len(des))
	}
	for _, de := range des {
		name, p := de.Name(), path.Join(dir, de.Name())
		switch {
		case de.IsDir():
			if depth > 0 {
				return false, p + " is a folder below a subfolder"
			}
			if ok, why := driverOnly(h, p, version, depth+1); !ok {
				return false, why
			}
			continue
		case !de.Type().IsRegular():
			continue
		}
		if base, v, found := strings.Cut(name, ".so."); found && versionRE.MatchString(v) && nvidiaName(base) && driverVersionLike(v) && v != version {
			return false, fmt.Sprintf("%s is of driver %s", p, v)
		}
		if strings.Contains(name, ".so") && !nvidiaName(name) && !bundledLoader(name) {
			return false, p + " is not the driver's"
		}
		if info, err := de.Info(); err == nil && info.Mode()&0o111 != 0 && !strings.Contains(name, ".so") && !nvidiaName(name) {
			return false, p + " is a program that is not the driver's"
		}
	}
	return true, ""
}

// nvidiaName is a file name of NVIDIA's driver: libcuda*, libnv*, *nvidia*.
func nvidiaName(name string) bool {
	l := strings.ToLower(name)
	return strings.Contains(l, "nvidia") || strings.HasPrefix(l, "libcuda") || strings.HasPrefix(l, "libnv") || strings.HasPrefix(l, "nv")
}

// bundledLoader is a vendor-neutral loader that NVIDIA's installer puts beside
// its libraries in a folder of its own.
func bundledLoader(name string) bool {
	for _, p := range []string{"libOpenCL.so", "libGL.so", "libGLX.so", "libGLdispatch.so", "libEGL.so", "libGLESv1_CM.so", "libGLESv2.so", "libOpenGL.so", "libvdpau"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// driverVersionLike: NVIDIA driver versions start at 3 digits (384.130);
// libnvidia-egl-wayland.so.1.1.13 carries its own, small version.
func driverVersionLike(v string) bool {
	major, _, _ := strings.Cut(v, ".")
	return len(major) >= 3
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
	pl := &planner{files: files, version: version, onlyVersion: len(files.Versions()) == 1, rules: rules, kinds: map[string]folderKind{}}
	chosen, names := pl.chooseLibraries()
	if len(names) == 0 {
		return plan, pl.notes, pl.noLibraries()
	}
	for _, base := range RequiredLibraries {
		if _, ok := chosen[base+".so."+version]; !ok {
			return plan, pl.notes, &PlanError{ConditionRequiredLibraryMissing, fmt.Sprintf("%s.so.%s not found", base, version)}
		}
	}

	plan = layout.Plan{
		SchemaVersion:     layout.SchemaVersion,
		DriverVersion:     version,
		CUDADriverVersion: cudaVersion,
		LibraryPaths:      []string{libDir},
	}
	plan.Mounts = pl.libraryMounts(plan.Mounts, chosen, names, libDir)
	bins, binNames := pl.chooseBinaries()
	plan.Mounts = pl.binaryMounts(plan.Mounts, bins, binNames, binDir)

	plan.Normalize()
	if errs := plan.Validate(rules); len(errs) > 0 {
		return plan, pl.notes, &PlanError{ConditionPlanInvalid, errs.ToAggregate().Error()}
	}
	return plan, pl.notes, nil
}

// planner holds what BuildPlan learns of one driver version's folders as it
// goes: each folder's kind, found once, and the notes, in the order found.
type planner struct {
	files   *Files
	version string
	// onlyVersion: the host has no other driver version.
	onlyVersion bool
	rules       layout.Rules
	kinds       map[string]folderKind
	notes       []string
}

func (pl *planner) note(format string, args ...any) {
	pl.notes = append(pl.notes, fmt.Sprintf(format, args...))
}

// kindOf is the kind of the folder of p.
func (pl *planner) kindOf(p string) folderKind {
	d := path.Dir(p)
	k, ok := pl.kinds[d]
	if !ok {
		k = classify(pl.rules, d, path.Base(p))
		// The allowlist says a folder may be mounted whole; its content
		// says whether it should: only if it holds this driver alone.
		if k == folderDedicated {
			if only, why := driverOnly(pl.files.h, d, pl.version, 0); !only {
				pl.note("%s: mounted file by file, as %s", d, why)
				k = folderShared
			}
		}
		pl.kinds[d] = k
	}
	return k
}

// chooseLibraries takes one library per name, best folder first; Discover's
// order breaks ties. names are the names chosen, sorted.
func (pl *planner) chooseLibraries() (chosen map[string]Library, names []string) {
	chosen = map[string]Library{}
	for _, l := range pl.files.Libraries {
		if l.Version != pl.version {
			continue
		}
		k := pl.kindOf(l.Path)
		if k == folderForbidden {
			pl.note("%s: outside the host path allowlist", l.Path)
			continue
		}
		prev, ok := chosen[l.Name]
		if !ok {
			names = append(names, l.Name)
		}
		if !ok || k < pl.kindOf(prev.Path) {
			if ok {
				pl.note("%s: duplicate of %s", prev.Path, l.Path)
			}
			chosen[l.Name] = l
		} else {
			pl.note("%s: duplicate of %s", l.Path, prev.Path)
		}
	}
	sort.Strings(names)
	return chosen, names
}

// noLibraries says why no library of the version was chosen: its folders
// are outside the allowlist, or there is none.
func (pl *planner) noLibraries() *PlanError {
	var outside []string
	for _, l := range pl.files.Libraries {
		if l.Version == pl.version {
			outside = appendNew(outside, path.Dir(l.Path))
		}
	}
	if len(outside) > 0 {
		return &PlanError{ConditionDriverFilesNotAllowed, fmt.Sprintf("the driver %s is in %s, outside the host path allowlist; add the folder to hostPaths.extraAllowlist to serve this node", pl.version, strings.Join(outside, ", "))}
	}
	return &PlanError{ConditionDriverFilesNotFound, fmt.Sprintf("no driver library of version %s under the host root", pl.version)}
}

// libraryMounts mounts the chosen libraries at libDir: their folder whole
// when one dedicated folder holds them all, else file by file under each
// name and SONAME.
func (pl *planner) libraryMounts(ms []layout.Mount, chosen map[string]Library, names []string, libDir string) []layout.Mount {
	libFolders := map[string]bool{}
	for _, n := range names {
		libFolders[path.Dir(chosen[n].Path)] = true
	}
	if d, ok := single(libFolders); ok && pl.kindOf(chosen[names[0]].Path) == folderDedicated {
		return append(ms, layout.Mount{HostPath: d, ContainerPath: libDir, Kind: layout.KindDirectory})
	}
	for _, n := range names {
		l := chosen[n]
		for _, as := range append([]string{l.Name}, l.SONAMEs...) {
			ms = appendMount(ms, layout.Mount{HostPath: l.Path, ContainerPath: path.Join(libDir, as), Kind: layout.KindFile})
		}
	}
	return ms
}

// ownBinFolder reports whether the dedicated folder d holds this driver's
// binaries. A dedicated folder counts only if libraries of this version sit
// beside it (D/bin next to D, D/lib64 or D/lib), so that nvidia-384/bin is
// never paired with the 390 libraries.
func (pl *planner) ownBinFolder(d string) bool {
	// Nothing else to pair it with, or the folder names the version
	// (/opt/nvidia/570.181/bin, a Nix store path).
	if pl.onlyVersion || strings.Contains(d, pl.version) {
		return true
	}
	parent := path.Dir(d)
	for _, l := range pl.files.Libraries {
		if l.Version != pl.version {
			continue
		}
		switch path.Dir(l.Path) {
		case parent, path.Join(parent, "lib64"), path.Join(parent, "lib"):
			return true
		}
	}
	return false
}

// chooseBinaries takes one binary per name, best folder first, from the
// folders allowed that belong to this driver. binNames are the names
// chosen, sorted.
func (pl *planner) chooseBinaries() (bins map[string]Binary, binNames []string) {
	bins = map[string]Binary{}
	for _, b := range pl.files.Binaries {
		k := pl.kindOf(b.Path)
		switch {
		case k == folderForbidden:
			pl.note("%s: outside the host path allowlist", b.Path)
			continue
		case k == folderDedicated && !pl.ownBinFolder(path.Dir(b.Path)):
			pl.note("%s: belongs to another driver folder", b.Path)
			continue
		}
		prev, ok := bins[b.Name]
		if !ok {
			binNames = append(binNames, b.Name)
			bins[b.Name] = b
		} else if k < pl.kindOf(prev.Path) {
			bins[b.Name] = b
		}
	}
	sort.Strings(binNames)
	return bins, binNames
}

// binaryMounts mounts the chosen binaries at binDir, by the libraries' rule.
func (pl *planner) binaryMounts(ms []layout.Mount, bins map[string]Binary, binNames []string, binDir string) []layout.Mount {
	binFolders := map[string]bool{}
	for _, n := range binNames {
		binFolders[path.Dir(bins[n].Path)] = true
	}
	if d, ok := single(binFolders); ok && pl.kindOf(bins[binNames[0]].Path) == folderDedicated {
		return append(ms, layout.Mount{HostPath: d, ContainerPath: binDir, Kind: layout.KindDirectory})
	}
	for _, n := range binNames {
		ms = appendMount(ms, layout.Mount{HostPath: bins[n].Path, ContainerPath: path.Join(binDir, n), Kind: layout.KindFile})
	}
	return ms
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
	if data, err := h.readFile("/sys/module/nvidia/version", maxSysfsBytes); err == nil {
		if v := strings.TrimSpace(string(data)); versionRE.MatchString(v) {
			return v
		}
	}
	if data, err := h.readFile("/proc/driver/nvidia/version", maxSysfsBytes); err == nil {
		// NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ...
		for _, f := range strings.Fields(string(data)) {
			if versionRE.MatchString(f) {
				return f
			}
		}
	}
	return ""
}
