package charts_test

// The chart refuses, at render time, exactly the configurations the binary refuses:
// values.schema.json the wrong types, unknown keys and enums, templates/_validate.tpl
// the rest with the binary's own messages. Every case runs both config.Validate and
// helm on the same values, so a rule added on one side only fails here.

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/config"
)

// coalesce merges values over base as helm merges a values file over the chart's
// values.yaml: maps key by key, a null deletes the key, anything else replaces.
func coalesce(base, values map[string]any) map[string]any {
	out := make(map[string]any, len(base))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range values {
		bm, baseIsMap := out[k].(map[string]any)
		vm, valueIsMap := v.(map[string]any)
		switch {
		case v == nil:
			delete(out, k)
		case baseIsMap && valueIsMap:
			out[k] = coalesce(bm, vm)
		default:
			out[k] = v
		}
	}
	return out
}

// binaryVerdict is what the webhook says about the configuration the chart renders
// from these values: a decode error (unknown field, wrong type) or Validate's errors.
func binaryVerdict(t *testing.T, values map[string]any) (field.ErrorList, error) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatalf("failed to read values.yaml: %v", err)
	}
	var base map[string]any
	if err := yaml.Unmarshal(data, &base); err != nil {
		t.Fatalf("failed to parse values.yaml: %v", err)
	}
	merged := coalesce(base, values)
	file, _ := merged["config"].(map[string]any)
	file = coalesce(file, map[string]any{"apiVersion": config.APIVersion, "kind": config.Kind})
	out, err := yaml.Marshal(file)
	if err != nil {
		t.Fatalf("failed to encode the configuration: %v", err)
	}
	c := &config.Configuration{}
	if err := yaml.UnmarshalStrict(out, c); err != nil {
		return nil, err
	}
	config.SetDefaults(c)
	return c.Validate(), nil
}

func writeValues(t *testing.T, values map[string]any) string {
	t.Helper()
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatalf("failed to encode values: %v", err)
	}
	// Not under t.TempDir: helm splits --values at commas, which test names hold.
	f, err := os.CreateTemp("", "values-*.yaml")
	if err != nil {
		t.Fatalf("failed to create a values file: %v", err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if _, err := f.Write(data); err != nil {
		t.Fatalf("failed to write values: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("failed to write values: %v", err)
	}
	return f.Name()
}

var chartMessage = regexp.MustCompile(`invalid configuration: (.*)`)

// sameErrors reports how helm's message differs from the binary's errors, whatever
// their order (a few of the binary's checks walk maps).
func sameErrors(helmErr string, errs field.ErrorList) string {
	m := chartMessage.FindStringSubmatch(helmErr)
	if m == nil {
		return "helm did not refuse with the binary's message"
	}
	got := m[1]
	var want []string
	for _, e := range errs {
		if !slices.Contains(want, e.Error()) {
			want = append(want, e.Error())
		}
	}
	if len(want) == 1 {
		if got != want[0] {
			return "helm says " + got + "\nthe binary " + want[0]
		}
		return ""
	}
	if !strings.HasPrefix(got, "[") || !strings.HasSuffix(got, "]") {
		return "helm gave one error, the binary several: " + got
	}
	rest := got[1 : len(got)-1]
	var missing []string
	for _, w := range want {
		if i := strings.Index(rest, w); i >= 0 {
			rest = rest[:i] + "\x00" + rest[i+len(w):]
		} else {
			missing = append(missing, w)
		}
	}
	if missing != nil || rest != strings.Repeat("\x00, ", len(want)-1)+"\x00" {
		return "helm says " + got + "\nthe binary's errors it lacks: " + strings.Join(missing, " | ") + "\nhelm's own: " + strings.ReplaceAll(strings.ReplaceAll(rest, "\x00, ", ""), "\x00", "")
	}
	return ""
}

func repeat(s string, n int) string { return strings.Repeat(s, n) }

// trickyHostPaths are allowlist entries on both sides of every rule: clean paths,
// path.Match's grammar, and each way to reach a system folder.
var trickyHostPaths = []string{
	"/srv/gpu", "/srv/gpu/", "/srv//gpu", "/srv/./gpu", "/srv/../gpu", "/srv/gpu/.", "/srv/gpu/..",
	"/.", "/..", "//", "/srv/gpu with space", "/srv/ünï", "/srv/" + repeat("x", 300),
	// path.Match's grammar
	`/srv/[gpu`, `/srv/gpu\`, `/srv/[]gpu]`, `/srv/[^]`, `/srv/[a-]`, `/srv/[-a]`, `/srv/[a-b-c]`,
	`/srv/[!a]`, `/srv/[^a]x`, `/srv/\[x`, `/srv/[\]]`, `/srv/[\-]`, `/srv/[^^]`, `/srv/[a^]`,
	`/srv/[ü]`, `/srv/[z-a]`, `/srv/a\*b`, `/srv/*/lib`, `/srv/[*]`, `/srv/[a*`,
	// system folders
	"/etc", "/etc/nvidia", "/usr", "/usr/lib", "/usr/lib/nvidia-*", "/usr/*", "/usr/lib/*", "/u*",
	"/*", "/?tc", "/[e]tc", "/e[t]c/x", "/[^x]sr", "/[a-z]sr/lib", "/lib*", "/l?b", "/bo[o]t",
	"/var", "/var/*", "/var/lib/*", "/var/*/kubelet", "/var/lib/kubelet/x", "/var/run",
	"/run/containerd/x", "/run/nvidia", "/run/*/driver", "/run/nvidia/driver/usr/lib64",
	"/opt", "/opt/*", "/opt/nvidia", "/srv", "/srv/*", "/tmp/x", "/tmp", "/proc/1/root",
	"/sys/x", "/dev/nvidia0", "/root/x", "/home/kubernetes/bin/nvidia", "/home/*/bin",
	"/nix/store/*-nvidia-x11-*", "/usr/local/nvidia", "/usr/lib/x86_64-linux-gnu/nvidia",
	"/usr/lib/x86_64-linux-gn?", "/usr/lib/x86_64-linux-gnu/*",
}

func allowlistEntries(paths []string, filesOnly bool) []any {
	var out []any
	for _, p := range paths {
		e := map[string]any{"path": p}
		if filesOnly {
			e["filesOnly"] = true
		}
		out = append(out, e)
	}
	return out
}

func mount(host, container, kind string) map[string]any {
	return map[string]any{"hostPath": host, "containerPath": container, "kind": kind}
}

const (
	lib64 = "/usr/local/nvidia/lib64"
	bin   = "/usr/local/nvidia/bin"
)

// TestConfigChecksAgree: for each case, helm renders exactly when config.Validate
// accepts, and refuses with the binary's messages, or by the schema naming the field.
func TestConfigChecksAgree(t *testing.T) {
	tests := map[string]struct {
		config map[string]any
		// schemaField, when set, is the field values.schema.json names (helm's
		// notation), and binaryField the one the binary names.
		schemaField, binaryField string
	}{
		"the defaults": {config: map[string]any{}},
		"a toleration for a native renameTo": {
			config: map[string]any{"resources": map[string]any{"renameTo": "kubernetes.io/gpu"}},
		},
		"no toleration for a native renameTo": {
			config: map[string]any{"resources": map[string]any{"renameTo": "kubernetes.io/gpu", "renameToleration": "None"}},
		},
		"a native renameTo with nothing to rename": {
			config: map[string]any{"resources": map[string]any{"renameTo": "requests.gpu/x", "legacy": []any{}}},
		},
		"static without a name": {
			config: map[string]any{"noLayout": map[string]any{"action": "Static"}},
		},
		"static layout not found": {
			config: map[string]any{"noLayout": map[string]any{"action": "Static", "staticLayout": "ubuntu"}},
		},
		"a static layout name with deny": {
			config: map[string]any{"noLayout": map[string]any{"action": "Deny", "staticLayout": "ubuntu"}},
		},
		"a static layout in use": {
			config: map[string]any{
				"noLayout": map[string]any{"action": "Static", "staticLayout": "ubuntu-384"},
				"staticLayouts": []any{map[string]any{
					"name": "ubuntu-384", "nodeSelector": map[string]any{"gpu-driver": "nvidia-384"}, "driverVersion": "384.130",
					"mounts":       []any{mount("/usr/lib/nvidia-384", lib64, "Directory"), mount("/usr/lib/nvidia-384/bin", bin, "Directory")},
					"libraryPaths": []any{lib64},
				}},
			},
		},
		"allowlist entries, whole folders": {
			config: map[string]any{"hostPaths": map[string]any{"extraAllowlist": allowlistEntries(trickyHostPaths, false)}},
		},
		"allowlist entries, files only": {
			config: map[string]any{"hostPaths": map[string]any{"extraAllowlist": allowlistEntries(trickyHostPaths, true)}},
		},
		"a replaced allowlist": {
			config: map[string]any{"hostPaths": map[string]any{"allowlist": allowlistEntries([]string{"/srv/gpu", "/usr/lib", "/srv/[", "/srv/gpu/"}, false)}},
		},
		"static layouts checked as a node's": {
			config: map[string]any{
				"hostPaths": map[string]any{"extraAllowlist": []any{
					map[string]any{"path": "/srv/gpu"},
					map[string]any{"path": "/srv/lib[0-9]", "filesOnly": true},
					map[string]any{"path": "/srv/[bad"},
				}},
				"staticLayouts": []any{
					map[string]any{
						"name": "many", "driverVersion": "v 1", "cudaDriverVersion": repeat("9!", 40),
						"mounts": []any{
							mount("/srv/gpu/lib", lib64, "Directory"),
							mount("/srv/lib3/libcuda.so.1", lib64+"/libcuda.so.1", "File"),
							mount("/srv/lib3/libfoo.so", lib64+"/libfoo.so", "File"),
							mount("/srv/lib3/libnvidia-ml.so.1", lib64+"/ml", "Directory"),
							mount("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", lib64+"/libnvidia-ml.so.1", "File"),
							mount("/usr/lib/x86_64-linux-gnu/nvidia-smi", lib64+"/x", "File"),
							mount("/usr/lib/nvidia-470/bin", bin, "Directory"),
							mount("/usr/lib/nvidia-470/proc/x", bin+"/p", "Directory"),
							mount("/srv/gpu/dev", bin+"/d", "Directory"),
							mount("/srv/bad/x", bin+"/b", "Directory"),
							mount("relative", bin+"/y", "File"),
							mount("", bin+"/e", "File"),
							mount("/srv/gpu/../etc", bin+"/z", "File"),
							mount("/", bin+"/r", "Directory"),
							mount("/srv/gpu/a\nb", bin+"/n", "File"),
							mount(repeat("r/", 200), bin+"/long", "File"),
							mount("/srv/gpu/f", lib64, "File"),
							mount("/srv/gpu/g", lib64+"x", "Directory"),
							mount("/srv/gpu/h", "/opt/x", "Directory"),
							mount("/srv/gpu/i", bin+"/y", "File"),
							mount("/srv/gpu/j", "lib", "File"),
							mount("/srv/gpu/k", bin+"/", "File"),
						},
						"libraryPaths": []any{lib64, "lib", lib64 + ":/x", "/opt/lib", lib64 + "/", bin},
					},
					map[string]any{"name": "pinned", "driverVersion": "570.86.15", "runtimeInjection": "toolkit", "libraryPaths": []any{lib64}},
					map[string]any{"name": "pinned", "driverVersion": "570.86.15", "runtimeInjection": "cdi"},
					// GKE's device plugin: library paths, within the
					// container mount points; no mounts.
					map[string]any{"name": "gke-libs", "driverVersion": "550.90.07", "runtimeInjection": "device-plugin", "libraryPaths": []any{lib64, "/opt/lib", "lib"}},
					map[string]any{"name": "gke-mounts", "driverVersion": "550.90.07", "runtimeInjection": "device-plugin", "mounts": []any{mount("/srv/gpu/lib", lib64, "Directory")}},
					map[string]any{"name": "nothing"},
					map[string]any{"name": repeat("n", 64), "driverVersion": "1", "mounts": []any{mount("/srv/gpu", bin, "Directory")},
						"nodeSelector": map[string]any{"ok": "fine", "a/b/c": "x", "Bad Key": "v", "k": "bad value!", "long": repeat("v", 64), "empty": ""}},
				},
			},
		},
		"names": {
			config: map[string]any{
				"resources": map[string]any{
					"names":    []any{"nvidia.com/gpu", "gpu", "nvidia.com/[mig", "nvidia.com/mig-*", "a/b/c"},
					"legacy":   []any{"alpha.kubernetes.io/nvidia-gpu", "a/b/c", "/x", "x/", "Upper.io/x", "nvidia.com/" + repeat("n", 64), repeat("p", 254) + "/x", "-x", "ok_name", "bad name!"},
					"renameTo": "bad name!",
				},
				"excludedNamespaces": []any{"kube-system", "Kube", "a.b", repeat("n", 64), "-x", ""},
				"dra": map[string]any{
					"deviceClasses": []any{"gpu.nvidia.com", "*.gpu.nvidia.com", "GPU", "a[.b", "mig-?g.nvidia.com", "[a-z]*.x", "a_b", "a]b"},
					"drivers":       []any{"gpu.nvidia.com", "Gpu", repeat("d", 254)},
				},
				"pinning":        map[string]any{"nodeLabels": []any{"karpenter.sh/nodepool", "example.com/" + repeat("n", 64), repeat("p", 254) + "/x"}},
				"hostPaths":      map[string]any{"driverFilePatterns": []any{"libcuda.so*", "[", `a\`, "[]]", "nvidia-smi"}},
				"containerPaths": map[string]any{"libraryDir": "/usr/local/nvidia/lib64/", "binaryDir": "/usr/local/./bin"},
			},
		},
		"legacy name is renameTo": {
			config: map[string]any{"resources": map[string]any{"legacy": []any{"nvidia.com/gpu"}}},
		},
		// The schema's: the binary refuses these as well, naming the same field.
		"an unknown action": {
			config:      map[string]any{"noLayout": map[string]any{"action": "Panic"}},
			schemaField: "config.noLayout.action", binaryField: "noLayout.action: Unsupported value",
		},
		"a relative extra entry": {
			config:      map[string]any{"hostPaths": map[string]any{"extraAllowlist": allowlistEntries([]string{"srv/gpu"}, false)}},
			schemaField: "config.hostPaths.extraAllowlist.0.path", binaryField: "hostPaths.extraAllowlist[0].path: Invalid value",
		},
		"a misspelt extra entry": {
			config:      map[string]any{"hostPaths": map[string]any{"extraAllowlist": []any{map[string]any{"pth": "/srv/gpu"}}}},
			schemaField: "config.hostPaths.extraAllowlist.0: Additional property pth", binaryField: `unknown field "pth"`,
		},
		"a number for a driver version": {
			config: map[string]any{"staticLayouts": []any{map[string]any{"name": "s", "driverVersion": 384.13,
				"mounts": []any{mount("/usr/lib/nvidia-384", lib64, "Directory")}}}},
			schemaField: "config.staticLayouts.0.driverVersion", binaryField: "driverVersion of type string",
		},
		"a mount kind": {
			config: map[string]any{"staticLayouts": []any{map[string]any{"name": "s", "driverVersion": "1",
				"mounts": []any{mount("/usr/lib/nvidia-384", lib64, "Socket")}}}},
			schemaField: "config.staticLayouts.0.mounts.0.kind", binaryField: "staticLayouts[0].mounts[0].kind: Unsupported value",
		},
		// GKE's device plugin mounts the driver itself: a cluster without
		// the probe pins its pods there with a static layout.
		"a static layout where the device plugin mounts the driver": {
			config: map[string]any{
				"noLayout":      map[string]any{"action": "Static", "staticLayout": "gke"},
				"staticLayouts": []any{map[string]any{"name": "gke", "driverVersion": "550.90.07", "runtimeInjection": "device-plugin", "libraryPaths": []any{lib64}, "nodeSelector": map[string]any{"cloud.google.com/gke-accelerator": "nvidia-l4"}}},
			},
		},
		"a runtime": {
			config:      map[string]any{"staticLayouts": []any{map[string]any{"name": "s", "driverVersion": "1", "runtimeInjection": "docker"}}},
			schemaField: "config.staticLayouts.0.runtimeInjection", binaryField: "staticLayouts[0].runtimeInjection: Unsupported value",
		},
		"no resource names": {
			config:      map[string]any{"resources": map[string]any{"names": []any{}}},
			schemaField: "config.resources.names", binaryField: "resources.names: Required value",
		},
		"pinning by the probe's label": {
			config:      map[string]any{"pinning": map[string]any{"nodeLabels": []any{"gpu-injector.io/layout-fingerprint"}}},
			schemaField: "config.pinning.nodeLabels.0", binaryField: "pinning.nodeLabels[0]: Forbidden",
		},
		"a negative memory": {
			config:      map[string]any{"pinning": map[string]any{"rememberFor": "-1h"}},
			schemaField: "config.pinning.rememberFor", binaryField: "pinning.rememberFor: Invalid value",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			values := map[string]any{"config": tc.config}
			errs, decodeErr := binaryVerdict(t, values)
			out, err := helmTemplate(t, renderOpts{kubeVersion: "1.36.3", files: []string{writeValues(t, values)}})
			switch {
			case tc.schemaField != "":
				binary := errors.Join(decodeErr, errs.ToAggregate())
				if binary == nil || !strings.Contains(binary.Error(), tc.binaryField) {
					t.Errorf("the binary does not refuse %s: %v", tc.binaryField, binary)
				}
				if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.schemaField) {
					t.Errorf("want the schema to refuse %s, got %v", tc.schemaField, err)
				}
			case decodeErr != nil:
				t.Fatalf("the binary cannot decode the values: %v", decodeErr)
			case len(errs) == 0:
				if err != nil {
					t.Fatalf("the binary accepts the values, helm refuses them: %v", err)
				}
				checkConfigMap(t, parseRendered(t, out))
			case err == nil:
				t.Fatalf("helm renders values the binary refuses: %v", errs.ToAggregate())
			default:
				if strings.Contains(err.Error(), "schema") {
					t.Errorf("refused by the schema, not with the binary's message: %v", err)
				}
				if diff := sameErrors(err.Error(), errs); diff != "" {
					t.Error(diff)
				}
			}
		})
	}
}

// TestConfigRefusedAtRender: the configurations that installed and then crash-looped
// the webhook now fail helm with its message.
func TestConfigRefusedAtRender(t *testing.T) {
	tests := map[string]struct {
		set  []string
		want string
	}{
		"static without a layout": {
			set:  []string{"config.noLayout.action=Static"},
			want: "invalid configuration: noLayout.staticLayout: Required value: the name of a staticLayouts entry, with action Static",
		},
		"a system folder added whole": {
			set:  []string{"config.hostPaths.extraAllowlist[0].path=/usr/lib"},
			want: "invalid configuration: hostPaths.extraAllowlist[0].path: Forbidden: it would allow the system folder /usr/lib whole; allow it only with filesOnly: true, or name the driver's own folder",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := helmTemplate(t, with(kube136, tc.set...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("want %q, got %v", tc.want, err)
			}
		})
	}
}

// TestExtraAllowlistKeepsDefaults: an added entry keeps every default one, reaches
// the file as written, and the rules the binary checks layouts against.
func TestExtraAllowlistKeepsDefaults(t *testing.T) {
	c := checkConfigMap(t, render(t, with(kube136, "config.hostPaths.extraAllowlist[0].path=/srv/gpu", "config.hostPaths.extraAllowlist[1].path=/srv/shared/lib", "config.hostPaths.extraAllowlist[1].filesOnly=true")))
	if !slices.Equal(c.HostPaths.Allowlist, config.DefaultAllowlist()) {
		t.Errorf("allowlist = %v, want the %d defaults", c.HostPaths.Allowlist, len(config.DefaultAllowlist()))
	}
	entries := c.Rules().HostPathAllowlist
	if n := len(config.DefaultAllowlist()); len(entries) != n+2 || entries[n].Path != "/srv/gpu" || entries[n].FilesOnly || entries[n+1].Path != "/srv/shared/lib" || !entries[n+1].FilesOnly {
		t.Errorf("allowlist in force = %v, want the defaults then /srv/gpu and /srv/shared/lib (files only)", entries)
	}
}
