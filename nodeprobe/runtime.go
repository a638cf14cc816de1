package nodeprobe

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/layout"
)

// maxConfigBytes bounds a runtime configuration file or CDI spec the probe
// reads: they come from the node, and real ones are a few KiB.
const maxConfigBytes = 1 << 20

// containerdConfigs are the containerd configuration files of the common
// installations, read in order; a later file's settings win, as with
// containerd's own imports.
var containerdConfigs = []string{
	"/etc/containerd/config.toml",
	// k3s and RKE2 write their own, beside their data.
	"/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
	"/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
}

// containerdDropIns are the drop-in folders containerd 2 distributions
// import by default and where nvidia-ctk writes its drop-in.
var containerdDropIns = []string{"/etc/containerd/conf.d", "/etc/containerd/config.d"}

// crioConfigs: the main file, then the drop-ins in name order.
var (
	crioConfig  = "/etc/crio/crio.conf"
	crioDropIns = "/etc/crio/crio.conf.d"
	// ociHookDirs are CRI-O's and Podman's default hook folders, and
	// /run/containers/oci/hooks.d, where the GPU operator's toolkit writes
	// its hook on OpenShift (NVIDIA/gpu-operator
	// assets/state-container-toolkit/0500_daemonset.yaml: the crio-hooks
	// volume; controllers/object_controls.go moves it to
	// /usr/share/containers/oci/hooks.d elsewhere). CRI-O's own hooks_dir
	// setting adds its folders (crioHookDirs).
	ociHookDirs  = []string{"/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d", "/run/containers/oci/hooks.d"}
	cdiSpecDirs  = []string{"/etc/cdi", "/var/run/cdi", "/run/cdi"}
	criDockerd   = []string{"/usr/bin/cri-dockerd", "/usr/local/bin/cri-dockerd", "/run/cri-dockerd.sock", "/var/run/cri-dockerd.sock"}
	dockerConfig = "/etc/docker/daemon.json"
)

// RuntimeInjection is what the probe found about the node's container
// runtime, or its device plugin, putting the driver into containers itself.
type RuntimeInjection struct {
	// Kind is layout.RuntimeToolkit, layout.RuntimeDevicePlugin,
	// layout.RuntimeCDI, or "" for none.
	Kind string `json:"kind,omitempty"`
	// Evidence names the files and settings that say so.
	Evidence []string `json:"evidence,omitempty"`
	// LibraryPaths are the container folders the device plugin's mount puts
	// the driver's libraries in, for LD_LIBRARY_PATH, which it does not set;
	// empty for the toolkit and CDI, whose runtime runs ldconfig in the
	// container. They come from the host, and are checked against the
	// configuration's container paths before they are published.
	LibraryPaths []string `json:"libraryPaths,omitempty"`
	// Notes are files that could not be read or parsed.
	Notes []string `json:"notes,omitempty"`
}

// DetectRuntimeInjection reads the host's container runtime configuration:
// the NVIDIA container toolkit as the default runtime of containerd, CRI-O or
// Docker (through cri-dockerd), an always-on OCI hook of the toolkit, GKE's
// device plugin (which mounts the driver folder in its Allocate answer), or a
// CDI spec for nvidia.com/gpu. The toolkit wins over CDI: a toolkit runtime
// in CDI mode is still the toolkit. GKE's device plugin comes before CDI: its
// mounts reach every container that gets a GPU, a CDI spec's only those whose
// devices are asked for through CDI.
func DetectRuntimeInjection(root string) RuntimeInjection {
	h := hostFS{root: root}
	var r RuntimeInjection
	r.Evidence = append(r.Evidence, h.containerdToolkit(&r.Notes)...)
	r.Evidence = append(r.Evidence, h.crioToolkit(&r.Notes)...)
	r.Evidence = append(r.Evidence, h.ociHookToolkit(&r.Notes)...)
	r.Evidence = append(r.Evidence, h.dockerToolkit(&r.Notes)...)
	if len(r.Evidence) > 0 {
		r.Kind = layout.RuntimeToolkit
		return r
	}
	if ev, libs := h.gkeDevicePlugin(&r.Notes); len(ev) > 0 {
		r.Kind, r.Evidence, r.LibraryPaths = layout.RuntimeDevicePlugin, ev, []string{libs}
		return r
	}
	if ev := h.cdiSpecs(&r.Notes); len(ev) > 0 {
		r.Kind, r.Evidence = layout.RuntimeCDI, ev
	}
	return r
}

// isToolkitRuntime: nvidia-container-runtime, its .cdi and .legacy modes, and
// the toolkit installed under another prefix (/usr/local/nvidia/toolkit/...).
func isToolkitRuntime(binary string) bool {
	return strings.HasPrefix(path.Base(binary), "nvidia-container-runtime")
}

// isToolkitHook: the toolkit's prestart hook, under its name of old
// (nvidia-container-toolkit) or of now.
func isToolkitHook(binary string) bool {
	b := path.Base(binary)
	return strings.HasPrefix(b, "nvidia-container-runtime-hook") || b == "nvidia-container-toolkit"
}

// Bottlerocket runs the toolkit under its own runtime name: containerd's
// default runtime binary is nvidia-oci, a link to shimpei, which runs runc
// through oci-add-hooks with the hooks of /etc/shimpei/<its name>-hooks.json,
// the toolkit's prestart hook (bottlerocket-os/bottlerocket-core-kit:
// sources/shimpei/src/main.rs HOOKS_CONFIG_BASE_PATH and the hook path it
// builds from argv[0]; packages/nvidia-container-toolkit/nvidia-container-toolkit.spec
// links nvidia-oci to shimpei; its nvidia-oci-hooks-json template).
const (
	shimpeiBinary   = "shimpei"
	shimpeiHooksDir = "/etc/shimpei"
)

// runtimeBinDirs is where a runtime named without a folder is looked up, as
// containerd looks it up in its PATH.
var runtimeBinDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// toolkitRuntime reports how a runtime binary runs the toolkit, "" when it
// does not: the toolkit's runtime itself, or a wrapper that adds the
// toolkit's hook (Bottlerocket's shimpei).
func (h hostFS) toolkitRuntime(binary string, notes *[]string) string {
	if isToolkitRuntime(binary) {
		return "runs " + binary
	}
	if binary == "" {
		return ""
	}
	candidates := []string{binary}
	if !path.IsAbs(binary) {
		candidates = nil
		for _, d := range runtimeBinDirs {
			candidates = append(candidates, path.Join(d, binary))
		}
	}
	for _, c := range candidates {
		real, err := h.resolve(c)
		if err != nil {
			continue
		}
		if path.Base(real) != shimpeiBinary {
			return ""
		}
		// shimpei names the hooks file after its argv[0], which is the
		// runtime binary as containerd names it.
		hooks := binary + "-hooks.json"
		if !path.IsAbs(binary) {
			hooks = path.Join(shimpeiHooksDir, hooks)
		}
		data, ok := h.readConfig(hooks, notes)
		if !ok {
			return ""
		}
		if hook := toolkitHookOf(data, hooks, notes); hook != "" {
			return fmt.Sprintf("runs %s (%s), which adds the hooks of %s: %s", c, real, hooks, hook)
		}
		return ""
	}
	return ""
}

// toolkitHookOf returns the toolkit's hook among the hooks of an
// oci-add-hooks configuration (an OCI runtime spec's hooks object), "" when
// it has none.
func toolkitHookOf(data []byte, file string, notes *[]string) string {
	var cfg struct {
		Hooks map[string][]struct {
			Path string `json:"path"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		*notes = append(*notes, fmt.Sprintf("%s: %v", file, err))
		return ""
	}
	// The stages in which a hook sees the container's root before its
	// process runs.
	for _, stage := range []string{"prestart", "createRuntime", "createContainer"} {
		for _, hk := range cfg.Hooks[stage] {
			if isToolkitHook(hk.Path) {
				return stage + " hook " + hk.Path
			}
		}
	}
	return ""
}

func (h hostFS) readConfig(p string, notes *[]string) ([]byte, bool) {
	real, err := h.resolve(p)
	if err != nil {
		return nil, false
	}
	data, err := h.readFile(real, maxConfigBytes)
	switch {
	case errors.Is(err, errNotRegular) || errors.Is(err, errTooLarge):
		*notes = append(*notes, fmt.Sprintf("%s: not a regular file under %d bytes", p, maxConfigBytes))
		return nil, false
	case err != nil:
		*notes = append(*notes, err.Error())
		return nil, false
	}
	return data, true
}

// folderFiles lists the regular files of a host folder with one of the
// suffixes, in name order.
func (h hostFS) folderFiles(dir string, suffixes ...string) []string {
	real, err := h.resolve(dir)
	if err != nil {
		return nil
	}
	des, err := h.readDir(real)
	if err != nil {
		return nil
	}
	var out []string
	for _, de := range des {
		for _, s := range suffixes {
			if strings.HasSuffix(de.Name(), s) {
				out = append(out, path.Join(real, de.Name()))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// containerdToolkit merges containerd's files and reports the default runtime
// when it is the toolkit. Configuration versions 1 and 2 keep the CRI plugin
// at "io.containerd.grpc.v1.cri" (version 1 also as "cri"), version 3
// (containerd 2) at "io.containerd.cri.v1.runtime".
func (h hostFS) containerdToolkit(notes *[]string) []string {
	files := append([]string(nil), containerdConfigs...)
	for _, d := range containerdDropIns {
		files = append(files, h.folderFiles(d, ".toml")...)
	}
	merged := map[string]any{}
	var read []string
	for _, f := range files {
		data, ok := h.readConfig(f, notes)
		if !ok {
			continue
		}
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			*notes = append(*notes, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		read = append(read, f)
		mergeTOML(merged, m)
		// Files a configuration imports, as containerd does (globs too).
		if imports, ok := m["imports"].([]any); ok {
			for _, i := range imports {
				s, _ := i.(string)
				if !path.IsAbs(s) {
					continue
				}
				for _, g := range h.folderFiles(path.Dir(s), "") {
					if ok, _ := path.Match(s, g); ok || g == s {
						if d, ok := h.readConfig(g, notes); ok {
							var im map[string]any
							if _, err := toml.Decode(string(d), &im); err == nil {
								read = append(read, g)
								mergeTOML(merged, im)
							}
						}
					}
				}
			}
		}
	}
	if len(read) == 0 {
		return nil
	}
	for _, plugin := range []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "cri"} {
		cri := table(table(merged, "plugins"), plugin)
		ctrd := table(cri, "containerd")
		if ctrd == nil {
			continue
		}
		name, _ := ctrd["default_runtime_name"].(string)
		var rt map[string]any
		if name == "" {
			// Version 1 may name an inline default runtime; otherwise
			// containerd's default is "runc", whose binary a hand-edited
			// configuration sometimes replaces with the toolkit's.
			if rt = table(ctrd, "default_runtime"); rt != nil {
				name = "default_runtime"
			} else {
				name = "runc"
			}
		}
		if rt == nil {
			rt = table(table(ctrd, "runtimes"), name)
		}
		if rt == nil {
			continue
		}
		bin, _ := table(rt, "options")["BinaryName"].(string)
		if bin == "" {
			// The v1 linux shim names the runtime binary directly.
			bin, _ = rt["runtime_engine"].(string)
		}
		if how := h.toolkitRuntime(bin, notes); how != "" {
			return []string{fmt.Sprintf("containerd (%s): the default runtime %q %s", strings.Join(read, ", "), name, how)}
		}
	}
	return nil
}

func (h hostFS) crioToolkit(notes *[]string) []string {
	merged := map[string]any{}
	var read []string
	for _, f := range append([]string{crioConfig}, h.folderFiles(crioDropIns, ".conf")...) {
		data, ok := h.readConfig(f, notes)
		if !ok {
			continue
		}
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			*notes = append(*notes, fmt.Sprintf("%s: %v", f, err))
			continue
		}
		read = append(read, f)
		mergeTOML(merged, m)
	}
	rt := table(table(merged, "crio"), "runtime")
	name, _ := rt["default_runtime"].(string)
	if name == "" {
		return nil
	}
	bin, _ := table(table(rt, "runtimes"), name)["runtime_path"].(string)
	if isToolkitRuntime(bin) {
		return []string{fmt.Sprintf("CRI-O (%s): the default runtime %q runs %s", strings.Join(read, ", "), name, bin)}
	}
	return nil
}

// crioHookDirs are the hook folders CRI-O's configuration names
// ([crio.runtime] hooks_dir), which replace its defaults; OpenShift lists
// /run/containers/oci/hooks.d there.
func (h hostFS) crioHookDirs(notes *[]string) []string {
	merged := map[string]any{}
	for _, f := range append([]string{crioConfig}, h.folderFiles(crioDropIns, ".conf")...) {
		data, ok := h.readConfig(f, notes)
		if !ok {
			continue
		}
		var m map[string]any
		if _, err := toml.Decode(string(data), &m); err != nil {
			continue
		}
		mergeTOML(merged, m)
	}
	list, _ := table(table(merged, "crio"), "runtime")["hooks_dir"].([]any)
	var out []string
	for _, d := range list {
		if s, ok := d.(string); ok && path.IsAbs(s) {
			out = append(out, path.Clean(s))
		}
	}
	return out
}

// ociHookToolkit: the toolkit's OCI hook for CRI-O and Podman, installed as
// oci-nvidia-hook.json, applies to every container when "always" is set.
func (h hostFS) ociHookToolkit(notes *[]string) []string {
	var out []string
	dirs := slices.Clone(ociHookDirs)
	for _, d := range h.crioHookDirs(notes) {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		for _, f := range h.folderFiles(d, ".json") {
			if seen[f] {
				continue // a folder reached twice through links
			}
			seen[f] = true
			data, ok := h.readConfig(f, notes)
			if !ok {
				continue
			}
			var hook struct {
				Hook struct {
					Path string `json:"path"`
				} `json:"hook"`
				When struct {
					Always bool `json:"always"`
				} `json:"when"`
			}
			if err := json.Unmarshal(data, &hook); err != nil {
				*notes = append(*notes, fmt.Sprintf("%s: %v", f, err))
				continue
			}
			if hook.When.Always && (isToolkitHook(hook.Hook.Path) || strings.HasPrefix(path.Base(hook.Hook.Path), "nvidia-container-")) {
				out = append(out, fmt.Sprintf("OCI hook %s runs %s in every container", f, hook.Hook.Path))
			}
		}
	}
	return out
}

// dockerToolkit counts only where the kubelet can reach Docker (cri-dockerd):
// a workstation's daemon.json says nothing about Kubernetes pods.
func (h hostFS) dockerToolkit(notes *[]string) []string {
	data, ok := h.readConfig(dockerConfig, notes)
	if !ok {
		return nil
	}
	shim := ""
	for _, p := range criDockerd {
		if _, _, err := h.stat(p); err == nil {
			shim = p
			break
		}
	}
	if shim == "" {
		return nil
	}
	var cfg struct {
		DefaultRuntime string `json:"default-runtime"`
		Runtimes       map[string]struct {
			Path string `json:"path"`
		} `json:"runtimes"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		*notes = append(*notes, fmt.Sprintf("%s: %v", dockerConfig, err))
		return nil
	}
	if bin := cfg.Runtimes[cfg.DefaultRuntime].Path; cfg.DefaultRuntime != "" && isToolkitRuntime(bin) {
		return []string{fmt.Sprintf("Docker (%s, through %s): the default runtime %q runs %s", dockerConfig, shim, cfg.DefaultRuntime, bin)}
	}
	return nil
}

// cdiSpecs finds CDI specs of kind nvidia.com/gpu with at least one device.
func (h hostFS) cdiSpecs(notes *[]string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range cdiSpecDirs {
		for _, f := range h.folderFiles(d, ".yaml", ".yml", ".json") {
			if seen[f] {
				continue // /var/run is a link to /run
			}
			seen[f] = true
			data, ok := h.readConfig(f, notes)
			if !ok {
				continue
			}
			var spec struct {
				Kind    string `json:"kind"`
				Devices []struct {
					Name string `json:"name"`
				} `json:"devices"`
			}
			if err := yaml.Unmarshal(data, &spec); err != nil {
				*notes = append(*notes, fmt.Sprintf("%s: %v", f, err))
				continue
			}
			if spec.Kind == "nvidia.com/gpu" && len(spec.Devices) > 0 {
				out = append(out, fmt.Sprintf("CDI spec %s: %d nvidia.com/gpu devices", f, len(spec.Devices)))
			}
		}
	}
	return out
}

func table(m map[string]any, key string) map[string]any {
	if m == nil {
		return nil
	}
	t, _ := m[key].(map[string]any)
	return t
}

// mergeTOML merges src into dst: tables deeply, everything else replaced.
func mergeTOML(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok {
			if dv, ok := dst[k].(map[string]any); ok {
				mergeTOML(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}
