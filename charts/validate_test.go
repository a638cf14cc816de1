package charts_test

// The chart leaves the configuration to the binary. values.schema.json, generated from
// the Go types (hack/chart-schema), refuses unknown keys, wrong types and unknown
// choices at render time; the install hook runs gpu-injector config validate on the
// file the chart renders for every other rule. Every case here runs config.Validate on
// the values and helm on the same values: the schema never refuses a file the binary
// accepts, whatever it refuses the binary refuses too, and the hook's ConfigMap carries
// the values as written, so that its verdict is the binary's on them.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/cmd"
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

// messages are the errors as the binary prints them, sorted (a few of its checks
// walk maps), less the lines of the file they were found in: the values compared
// with a rendered file have none.
func messages(errs field.ErrorList) []string {
	var out []string
	for _, e := range errs {
		out = append(out, withoutLine(e.Error()))
	}
	slices.Sort(out)
	return out
}

var (
	// lineFirst is the line a detail starts with; lineOnly a detail that is one.
	lineFirst = regexp.MustCompile(`(in \S+, )?on line [0-9]+; `)
	lineOnly  = regexp.MustCompile(`: (in \S+, )?on line [0-9]+$`)
)

func withoutLine(msg string) string {
	return lineOnly.ReplaceAllString(lineFirst.ReplaceAllString(msg, ""), "")
}

// hookVerdict is the install hook's verdict: gpu-injector config validate's check of
// the hook's ConfigMap, which must hold the release ConfigMap's file.
func hookVerdict(t *testing.T, r rendered) config.Verdict {
	t.Helper()
	hook := mustGet[corev1.ConfigMap](t, r, "ConfigMap", hookName)
	release := mustGet[corev1.ConfigMap](t, r, "ConfigMap", fullname+"-config")
	if hook.Data[config.ConfigMapKey] != release.Data[config.ConfigMapKey] {
		t.Errorf("the hook checks another file than the release installs:\n%s\n---\n%s", hook.Data[config.ConfigMapKey], release.Data[config.ConfigMapKey])
	}
	vs, err := config.Check([]byte(hook.Data[config.ConfigMapKey]))
	if err != nil || len(vs) != 1 {
		t.Fatalf("the hook's ConfigMap: %v, %v", vs, err)
	}
	return vs[0]
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

// TestConfigChecksAgree: for each case, the schema refuses only what the binary
// refuses, naming the field, and the hook's verdict on what helm renders is the
// binary's on the values.
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
			config: map[string]any{"hostPaths": map[string]any{"extraAllowlist": allowlistEntries([]string{"srv/gpu"}, false)}},
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
			config: map[string]any{"resources": map[string]any{"names": []any{}}},
		},
		"pinning by the probe's label": {
			config: map[string]any{"pinning": map[string]any{"nodeLabels": []any{"gpu-injector.io/layout-fingerprint"}}},
		},
		"a negative memory": {
			config: map[string]any{"pinning": map[string]any{"rememberFor": "-1h"}},
		},
		"a duration that is none": {
			config: map[string]any{"pinning": map[string]any{"rememberFor": "3days"}},
		},
		// Empty choices are the defaults, to the binary and the schema alike.
		"empty choices": {
			config: map[string]any{"ldLibraryPath": "", "noLayout": map[string]any{"action": ""}, "staticLayouts": []any{map[string]any{
				"name": "s", "schemaVersion": "", "runtimeInjection": "", "driverVersion": "1", "mounts": []any{mount("/usr/lib/nvidia-384", lib64, "Directory")}}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			values := map[string]any{"config": tc.config}
			errs, decodeErr := binaryVerdict(t, values)
			out, err := helmTemplate(t, renderOpts{kubeVersion: "1.36.3", files: []string{writeValues(t, values)}})
			if tc.schemaField != "" {
				binary := errors.Join(decodeErr, errs.ToAggregate())
				if binary == nil || !strings.Contains(binary.Error(), tc.binaryField) {
					t.Errorf("the binary does not refuse %s: %v", tc.binaryField, binary)
				}
				if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), tc.schemaField) {
					t.Errorf("want the schema to refuse %s, got %v", tc.schemaField, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("helm refuses values the schema should leave to the binary (%v, %v): %v", decodeErr, errs, err)
			}
			r := parseRendered(t, out)
			hook := hookVerdict(t, r)
			switch {
			case decodeErr != nil:
				if hook.Err == nil || hook.Err.Error() != "failed to parse configuration: "+decodeErr.Error() {
					t.Errorf("the binary cannot read the values (%v), the hook says %v", decodeErr, hook.Err)
				}
			case hook.Err != nil:
				t.Fatalf("the hook cannot read what the chart renders: %v", hook.Err)
			case !slices.Equal(messages(hook.Errs), messages(errs)):
				t.Errorf("the hook says:\n%s\nthe binary, of the values:\n%s", strings.Join(messages(hook.Errs), "\n"), strings.Join(messages(errs), "\n"))
			case len(errs) == 0:
				checkConfigMap(t, r)
			}
		})
	}
}

// TestConfigRefusedByHook: configurations that would crash-loop the webhook render,
// and the hook refuses them with the binary's message.
func TestConfigRefusedByHook(t *testing.T) {
	tests := map[string]struct {
		set  []string
		want string
	}{
		"static without a layout": {
			set:  []string{"config.noLayout.action=Static"},
			want: "noLayout.staticLayout: Required value: the name of a staticLayouts entry, with action Static",
		},
		"a system folder added whole": {
			set:  []string{"config.hostPaths.extraAllowlist[0].path=/usr/lib"},
			want: "hostPaths.extraAllowlist[0].path: Forbidden: it would allow the system folder /usr/lib whole; allow it only with filesOnly: true, or name the driver's own folder",
		},
		"a relative allowlist": {
			set:  []string{"config.hostPaths.allowlist[0].path=usr/lib"},
			want: `hostPaths.allowlist[0].path: Invalid value: "usr/lib": must be an absolute, clean path other than /`,
		},
		"pinning by the probe's label": {
			set:  []string{"config.pinning.nodeLabels={gpu-injector.io/layout-fingerprint}"},
			want: "pinning.nodeLabels[0]: Forbidden: gpu-injector.io/ labels are set by the probe",
		},
		"pinning by no label": {
			set:  []string{"config.pinning.nodeLabels={not a label}"},
			want: `pinning.nodeLabels[0]: Invalid value: "not a label"`,
		},
		"a duration that is none": {
			set:  []string{"config.pinning.rememberFor=3days"},
			want: `failed to parse configuration: error unmarshaling JSON: while decoding JSON: time: unknown unit "days" in duration "3days"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v := hookVerdict(t, render(t, with(kube136, tc.set...)))
			got := fmt.Sprint(v.Err)
			if v.Err == nil {
				got = strings.Join(messages(v.Errs), "\n")
				for _, e := range v.Errs {
					if !strings.Contains(e.Detail, "on line ") {
						t.Errorf("the hook's %q names no line of the file", e)
					}
				}
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("the hook says %q, want %q", got, tc.want)
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

// restricted is Pod Security's restricted level as the API server evaluates it.
func restricted(t *testing.T, spec corev1.PodTemplateSpec) []string {
	t.Helper()
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	agg := policy.AggregateCheckResults(evaluator.EvaluatePod(lv, &spec.ObjectMeta, &spec.Spec))
	return agg.ForbiddenReasons
}

// TestValidateHook: the hook runs before anything is installed or upgraded, on the
// file the release installs, with no privilege: Pod Security's restricted level, no
// API token, one read-only ConfigMap.
func TestValidateHook(t *testing.T) {
	r := render(t, kube136)
	cm := mustGet[corev1.ConfigMap](t, r, "ConfigMap", hookName)
	job := mustGet[batchv1.Job](t, r, "Job", hookName)
	for _, o := range []metav1.ObjectMeta{cm.ObjectMeta, job.ObjectMeta} {
		a := o.Annotations
		if a["helm.sh/hook"] != "pre-install,pre-upgrade" || !strings.Contains(a["helm.sh/hook-delete-policy"], "before-hook-creation") {
			t.Errorf("%s annotations %v: want a pre-install,pre-upgrade hook, replaced on the next run", o.Name, a)
		}
	}
	if cm.Annotations["helm.sh/hook-weight"] != "-1" || job.Annotations["helm.sh/hook-weight"] != "0" {
		t.Errorf("hook weights: ConfigMap %q, Job %q: the ConfigMap must come first", cm.Annotations["helm.sh/hook-weight"], job.Annotations["helm.sh/hook-weight"])
	}
	if job.Annotations["helm.sh/hook-output-log-policy"] != "hook-failed" {
		t.Errorf("helm does not print the Job's message when it fails: %v", job.Annotations)
	}
	for _, o := range r.objects {
		if hook := strings.Contains(o.GetAnnotations()["helm.sh/hook"], "pre-install"); hook != (o.GetName() == hookName) {
			t.Errorf("%s %s: an install hook %v", o.GetKind(), o.GetName(), hook)
		}
	}
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 || job.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("Job retries %v, deadline %v: want no retry and a deadline", job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
	}
	spec := job.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken || spec.ServiceAccountName != "" || spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("hook pod: token %v, service account %q, restart %s: want no token, the namespace's default account, no restart",
			spec.AutomountServiceAccountToken, spec.ServiceAccountName, spec.RestartPolicy)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 || len(spec.Volumes) != 1 {
		t.Fatalf("hook pod: %d containers, %d init containers, %d volumes: want one container and one volume", len(spec.Containers), len(spec.InitContainers), len(spec.Volumes))
	}
	c := spec.Containers[0]
	webhook := container(t, r.podSpecs(t)["Deployment/"+fullname+"-webhook"], "webhook")
	if c.Image != webhook.Image || !slices.Equal(c.Args, []string{"config", "validate", "-f", "/etc/gpu-injector/" + config.ConfigMapKey}) || len(c.Env) != 0 {
		t.Errorf("hook container: image %s, args %q, env %v: want the webhook's image, config validate of the mounted file, no env", c.Image, c.Args, c.Env)
	}
	if v := spec.Volumes[0]; v.ConfigMap == nil || v.ConfigMap.Name != hookName || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != v.Name ||
		c.VolumeMounts[0].MountPath != "/etc/gpu-injector" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("hook volume %+v mounted %+v: want the hook's ConfigMap read-only at /etc/gpu-injector", v, c.VolumeMounts)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("hook resources %v: want CPU and memory requests and a memory limit", c.Resources)
	}
	if reasons := restricted(t, job.Spec.Template); len(reasons) > 0 {
		t.Errorf("Pod Security restricted refuses the hook's pod: %v", reasons)
	}
	// The probe's pod mounts the host: the same evaluation refuses it.
	if reasons := restricted(t, r.podSpecs(t)["DaemonSet/"+probeSA]); len(reasons) == 0 {
		t.Error("Pod Security restricted admits the probe's pod: the evaluation proves nothing")
	}
	if got := hookVerdict(t, r); !got.Valid() {
		t.Errorf("the hook refuses the default configuration: %v %v", got.Err, got.Errs)
	}

	off := render(t, with(kube136, "validateHook.enabled=false"))
	if off.get("Job", hookName) != nil || off.get("ConfigMap", hookName) != nil {
		t.Errorf("validateHook.enabled=false renders the hook: %v", off.names())
	}
}

// TestValidateAsTyped: the check the README, docs/configuration.md and
// `gpu-injector config validate -h` show, helm template with no --kube-version piped to
// the binary's command, passes. Helm assumes v1.20.0 there when its build is not stamped
// with a version, as the test renders it; the same line with the build's own default is
// checked too.
func TestValidateAsTyped(t *testing.T) {
	values := filepath.Join(t.TempDir(), "my-values.yaml")
	if err := os.WriteFile(values, []byte("config:\n  excludedNamespaces: [batch-system]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, kube := range map[string][]string{
		"helm's unstamped default, v1.20.0": {"--kube-version", "1.20.0"},
		"the build's own default":           nil,
	} {
		t.Run(name, func(t *testing.T) {
			out, err := runHelm(t, append([]string{"template", "gpu-injector", chartDir, "-f", values}, kube...))
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr strings.Builder
			if code := cmd.Config([]string{"validate", "-f", "-"}, strings.NewReader(string(out)), &stdout, &stderr); code != 0 {
				t.Fatalf("gpu-injector config validate -f - exited %d:\n%s", code, stderr.String())
			}
			// The release's ConfigMap and the install hook's, one file, one verdict.
			if want := "standard input: ConfigMap default/gpu-injector-config, ConfigMap default/gpu-injector-validate: valid configuration\n"; stdout.String() != want {
				t.Errorf("stdout = %q, want %q", stdout.String(), want)
			}
		})
	}
}
