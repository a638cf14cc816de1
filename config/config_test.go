package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpu-injector/gpu-injector/layout"
)

func TestDefaultsValidate(t *testing.T) {
	if errs := Default().Validate(); len(errs) > 0 {
		t.Fatalf("defaults do not validate: %v", errs)
	}
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ContainerPaths.LibraryDir != "/usr/local/nvidia/lib64" || c.NoLayout.Action != NoLayoutDeny || c.Resources.RenameTo != "nvidia.com/gpu" || c.Resources.RenameToleration != RenameTolerationAdd {
		t.Errorf("unexpected defaults: %+v", c)
	}
}

func TestPinning(t *testing.T) {
	c := Default()
	if c.Pinning.ByPool() || c.Pinning.Remember() != DefaultRememberFor {
		t.Errorf("default pinning = %+v, want by fingerprint, remembered %s", c.Pinning, DefaultRememberFor)
	}
	c, err := Parse([]byte("pinning: {nodeLabels: [karpenter.sh/nodepool, node.kubernetes.io/instance-type], rememberFor: 0s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Pinning.ByPool() || c.Pinning.Remember() != 0 {
		t.Errorf("pinning = %+v, want by pool, never remembered", c.Pinning)
	}
}

func TestParseNamesEachBadField(t *testing.T) {
	head := "apiVersion: " + APIVersion + "\nkind: " + Kind + "\n"
	tests := map[string]struct {
		yaml string
		want []string
	}{
		"unknown field": {head + "resource: {}\n", []string{`resource: Forbidden: unknown field, on line 3; did you mean resources?`}},
		// Every unknown key at once, each with its line, at any depth; a name far from
		// every known one gets no suggestion.
		"unknown fields": {head + "ldLibaryPath: Prepend\nnoLayout:\n  actoin: Deny\nstaticLayouts:\n- name: s\n  driverVersion: \"1\"\n  mounts: [{hostPath: /usr/lib/x, containerPath: /usr/local/nvidia/lib64, kind: File, mode: ro}]\nzzzzzz: 1\n", []string{
			"ldLibaryPath: Forbidden: unknown field, on line 3; did you mean ldLibraryPath?",
			"noLayout.actoin: Forbidden: unknown field, on line 5; did you mean action?",
			"staticLayouts[0].mounts[0].mode: Forbidden: unknown field, on line 9",
			"zzzzzz: Forbidden: unknown field, on line 10",
		}},
		"images mode unquoted": {head + "images: {mode: On}\n", []string{`images.mode: Invalid value: on line 3; mode: On is read as a boolean (YAML 1.1); quote it: mode: "On"`}},
		"credential providers": {head + "images: {credentialProviders: {config: etc/config.json, binDir: /opt/bin/, timeout: 21s}}\n",
			[]string{"images.credentialProviders.config: Invalid", "images.credentialProviders.binDir: Invalid", "images.credentialProviders.timeout: Invalid"}},
		"credential providers without config": {head + "images: {credentialProviders: {binDir: /opt/bin}}\n", []string{"images.credentialProviders.config: Required"}},
		"credential providers at the root":    {head + "images: {credentialProviders: {config: /etc/config.json, binDir: /}}\n", []string{"images.credentialProviders.binDir: Invalid"}},
		"pinning duration":                    {head + "pinning: {rememberFor: three days}\n", []string{`invalid duration "three days"`}},
		"declared pool without pinning labels": {head + `pinning: {pools: [{pool: {karpenter.sh/nodepool: a}, layout: "{}"}]}
`, []string{"pinning.pools: Forbidden: on line 3; declared pools need pinning.nodeLabels"}},
		"declared pools": {head + `pinning:
  nodeLabels: [karpenter.sh/nodepool]
  pools:
  - {pool: {cloud.google.com/gke-nodepool: a}, layout: '{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/lib/nvidia-384","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}],"libraryPaths":["/usr/local/nvidia/lib64"]}'}
  - {pool: {karpenter.sh/nodepool: b}, layout: '{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/etc","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}],"libraryPaths":["/usr/local/nvidia/lib64"]}'}
  - {pool: {karpenter.sh/nodepool: c}, layout: 'not json'}
  - {pool: {karpenter.sh/nodepool: d}, taints: [{key: nvidia.com/gpu, effect: PreferNoSchedule}], layout: '{}'}
  - {pool: {karpenter.sh/nodepool: e}, layout: '{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/lib/nvidia-384","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}],"libraryPaths":["/usr/local/nvidia/lib64"]}'}
  - {pool: {karpenter.sh/nodepool: e}, layout: '{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/lib/nvidia-384","containerPath":"/usr/local/nvidia/lib64","kind":"Directory"}],"libraryPaths":["/usr/local/nvidia/lib64"]}'}
`, []string{
			"pinning.pools[0]: Invalid value: \"\": on line 6; the pool must give a value to each pinning label (karpenter.sh/nodepool) and to no other",
			"pinning.pools[1]: Invalid value: \"karpenter.sh/nodepool=b\"",
			"pinning.pools[2]: Invalid value: \"karpenter.sh/nodepool=c\"",
			"pinning.pools[3].taints[0].effect: Unsupported value: \"PreferNoSchedule\"",
			"pinning.pools[5].pool: Duplicate value: \"karpenter.sh/nodepool=e\"",
		}},
		"bad static layout": {head + `noLayout: {action: Static, staticLayout: s}
staticLayouts:
- name: s
  driverVersion: "1"
  mounts: [{hostPath: /etc, containerPath: /usr/local/nvidia/lib64, kind: Directory}]
`, []string{"staticLayouts[0].mounts[0].hostPath: Forbidden"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestStaticLayout(t *testing.T) {
	c, err := Parse([]byte(`apiVersion: config.gpu-injector.io/v1alpha1
kind: InjectorConfiguration
noLayout: {action: Static, staticLayout: ubuntu-384}
staticLayouts:
- name: ubuntu-384
  nodeSelector: {gpu-driver: nvidia-384}
  driverVersion: "384.130"
  mounts:
  - {hostPath: /usr/lib/nvidia-384, containerPath: /usr/local/nvidia/lib64, kind: Directory}
  libraryPaths: [/usr/local/nvidia/lib64]
`))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := c.Static("ubuntu-384")
	if !ok || s.SchemaVersion != "v1" || s.Plan.Mounts[0].HostPath != "/usr/lib/nvidia-384" || s.NodeSelector["gpu-driver"] != "nvidia-384" {
		t.Errorf("static layout: %+v", s)
	}
}

func TestLoad(t *testing.T) {
	c, err := Load("")
	if err != nil || c.Kind != Kind {
		t.Fatalf("Load(\"\") = %v, %v", c, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "failed to read configuration") {
		t.Errorf("missing file: %v", err)
	}
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("apiVersion: "+APIVersion+"\nkind: "+Kind+"\nnoLayout: {action: Allow}\n"), 0o644)
	if c, err := Load(f); err != nil || c.NoLayout.Action != NoLayoutAllow {
		t.Errorf("Load(file) = %+v, %v", c, err)
	}
}

func TestDRAPatternsParse(t *testing.T) {
	c, err := Parse([]byte("dra: {deviceClasses: [gpu.nvidia.com, '*.gpu.nvidia.com', 'mig-?g.nvidia.com'], drivers: [gpu.nvidia.com]}\nlegacyMounts: Keep\nruntimeInjection: Skip\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.DRA.DeviceClasses) != 3 || c.LegacyMounts != LegacyMountsKeep || c.RuntimeInjection != RuntimeInjectionSkip {
		t.Errorf("unexpected %+v", c)
	}
}

func TestRenameToleration(t *testing.T) {
	// Off is always valid; without legacy names nothing is renamed, so a
	// native renameTo needs no toleration either.
	for _, doc := range []string{
		"resources: {renameToleration: None}\n",
		"resources: {renameTo: kubernetes.io/gpu, renameToleration: None}\n",
		"resources: {renameTo: kubernetes.io/gpu, legacy: []}\n",
	} {
		if _, err := Parse([]byte(doc)); err != nil {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

// TestIsExtendedResourceName: the API server's rule, which decides whether
// the ExtendedResourceToleration admission plugin adds a toleration.
func TestIsExtendedResourceName(t *testing.T) {
	tests := map[string]bool{
		"nvidia.com/gpu":                 true,
		"nvidia.com/gpu.shared":          true,
		"nvidia.com/mig-1g.10gb":         true,
		"example.com/fpga":               true,
		"alpha.kubernetes.io/nvidia-gpu": false,
		"kubernetes.io/gpu":              false,
		"cpu":                            false,
		"requests.nvidia.com/gpu":        false,
		"nvidia.com/gpu!":                false,
	}
	for name, want := range tests {
		if got := IsExtendedResourceName(name); got != want {
			t.Errorf("IsExtendedResourceName(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestExtraAllowlist: extra entries add to the allowlist, defaulted or
// written, and reach the rules every layout is checked against.
func TestExtraAllowlist(t *testing.T) {
	srv := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "570.86.15", LibraryPaths: []string{"/usr/local/nvidia/lib64"},
		Mounts: []layout.Mount{{HostPath: "/srv/gpu/lib", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}}}
	extra := []layout.AllowedPath{{Path: "/srv/gpu"}, {Path: "/srv/shared/lib", FilesOnly: true}}
	tests := map[string]struct {
		yaml      string
		allowlist []layout.AllowedPath
		entries   []layout.AllowedPath
		srvValid  bool
	}{
		"none": {
			yaml:      "",
			allowlist: DefaultAllowlist(),
			entries:   DefaultAllowlist(),
		},
		"added to the defaults": {
			yaml:      "hostPaths: {extraAllowlist: [{path: /srv/gpu}, {path: /srv/shared/lib, filesOnly: true}]}\n",
			allowlist: DefaultAllowlist(),
			entries:   append(DefaultAllowlist(), extra...),
			srvValid:  true,
		},
		"added to a written allowlist": {
			yaml:      "hostPaths: {allowlist: [{path: /opt/nvidia}], extraAllowlist: [{path: /srv/gpu}, {path: /srv/shared/lib, filesOnly: true}]}\n",
			allowlist: []layout.AllowedPath{{Path: "/opt/nvidia"}},
			entries:   append([]layout.AllowedPath{{Path: "/opt/nvidia"}}, extra...),
			srvValid:  true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.HostPaths.Allowlist, tc.allowlist) {
				t.Errorf("allowlist = %v, want %v", c.HostPaths.Allowlist, tc.allowlist)
			}
			if got := c.HostPaths.Entries(); !slices.Equal(got, tc.entries) {
				t.Errorf("entries = %v, want %v", got, tc.entries)
			}
			if got := c.Rules().HostPathAllowlist; !slices.Equal(got, tc.entries) {
				t.Errorf("rules allowlist = %v, want %v", got, tc.entries)
			}
			if errs := srv.Validate(c.Rules()); (len(errs) == 0) != tc.srvValid {
				t.Errorf("a layout under /srv/gpu: errors %v, want valid %v", errs, tc.srvValid)
			}
		})
	}
	// Entries must not write into the allowlist's spare capacity, which
	// another caller's Entries would then see.
	c := Default()
	c.HostPaths.Allowlist = append(make([]layout.AllowedPath, 0, 8), layout.AllowedPath{Path: "/opt/nvidia"})
	c.HostPaths.ExtraAllowlist = []layout.AllowedPath{{Path: "/srv/a"}}
	a := c.HostPaths.Entries()
	c.HostPaths.ExtraAllowlist = []layout.AllowedPath{{Path: "/srv/b"}}
	if b := c.HostPaths.Entries(); a[1].Path != "/srv/a" || b[1].Path != "/srv/b" {
		t.Errorf("entries share memory: %v, %v", a, b)
	}
}

// TestDocumentedDefaults: the whole file that docs/configuration.md shows is the
// defaults, so the page cannot drift from SetDefaults.
func TestDocumentedDefaults(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatalf("failed to read the page: %v", err)
	}
	_, rest, ok := strings.Cut(string(data), "## The whole file, with its defaults\n")
	if !ok {
		t.Fatal("docs/configuration.md has no section \"The whole file, with its defaults\"")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	block, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("the section has no yaml block")
	}
	c, err := Parse([]byte(block))
	if err != nil {
		t.Fatalf("the documented file does not parse: %v", err)
	}
	// Semantic: the page's empty lists equal the unset defaults.
	if want := Default(); !apiequality.Semantic.DeepEqual(c, want) {
		t.Errorf("the documented file differs from the defaults:\n got %+v\nwant %+v", c, want)
	}
}

// TestImagesReadsImages: Off by default; On reads every namespace, or only
// those listed.
func TestImagesReadsImages(t *testing.T) {
	if c := Default(); c.Images.ReadsImages("default") || c.Images.Budget.Duration != DefaultImageBudget {
		t.Errorf("default images = %+v, want Off with the default budget", c.Images)
	}
	c, err := Parse([]byte("images: {mode: \"On\", registries: [localhost:5000], insecureRegistries: [localhost:5000]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Images.ReadsImages("default") {
		t.Errorf("mode On: want every namespace read")
	}
	c.Images.Namespaces = []string{"ml"}
	if c.Images.ReadsImages("default") || !c.Images.ReadsImages("ml") {
		t.Errorf("namespaces [ml]: want only ml read")
	}
}

// TestCredentialProvidersDefaults: off by default; with a config file the
// plugin timeout defaults.
func TestCredentialProvidersDefaults(t *testing.T) {
	if c := Default(); c.Images.CredentialProviders.Enabled() {
		t.Errorf("credential providers on by default: %+v", c.Images.CredentialProviders)
	}
	c, err := Parse([]byte("images: {credentialProviders: {config: /etc/eks/image-credential-provider/config.json, binDir: /etc/eks/image-credential-provider}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cp := c.Images.CredentialProviders; !cp.Enabled() || cp.Timeout.Duration != DefaultCredentialProviderTimeout {
		t.Errorf("credential providers = %+v, want on with the default timeout", cp)
	}
}

// TestYAMLBooleanHint: YAML 1.1, as the file is read, takes yes, no, on and off unquoted
// for booleans, which land in a string field as "true" or "false". An enum's error
// becomes the fix, its values quoted; any other error on such a field says how to quote
// it; every error says its line.
func TestYAMLBooleanHint(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want string
	}{
		"an enum": {"podSecurity: yes\n",
			`invalid configuration: podSecurity: Invalid value: on line 1; podSecurity: yes is read as a boolean (YAML 1.1); quote it: podSecurity: "Warn" or podSecurity: "Deny"`},
		"an enum, nested, the value in another case": {"\nimages:\n  mode: off\n",
			`invalid configuration: images.mode: Invalid value: on line 3; mode: off is read as a boolean (YAML 1.1); quote it: mode: "Off"`},
		"an enum of a named type, in a list": {"staticLayouts:\n- name: s\n  driverVersion: \"1\"\n  mounts: [{hostPath: /usr/lib/x, containerPath: /usr/local/nvidia/lib64, kind: YES}]\n",
			`failed to parse configuration: error unmarshaling JSON: while decoding JSON: json: cannot unmarshal bool into Go struct field Mount.staticLayouts.Plan.mounts.kind of type layout.MountKind; staticLayouts[0].mounts[0].kind: on line 4; kind: YES is read as a boolean (YAML 1.1); quote it: kind: "Directory" or kind: "File"`},
		"a path, nested": {"containerPaths: {libraryDir: Off}\n",
			`invalid configuration: containerPaths.libraryDir: Invalid value: "false": on line 1; must be an absolute, clean path other than / without ':'; libraryDir: Off is read as a boolean (YAML 1.1); quote it: libraryDir: "Off"`},
		"in a list": {"resources: {names: [nvidia.com/gpu, on]}\n",
			`invalid configuration: resources.names[1]: Invalid value: "true": on line 1; must be a qualified extended resource name or path.Match pattern, like nvidia.com/gpu or nvidia.com/mig-*; on is read as a boolean (YAML 1.1); quote it: "on"`},
		"quoted, no hint": {"podSecurity: \"yes\"\n",
			`invalid configuration: podSecurity: Unsupported value: "yes": on line 1; supported values: "Warn", "Deny"`},
		"tagged, no hint": {"podSecurity: !!str yes\n",
			`invalid configuration: podSecurity: Unsupported value: "yes": on line 1; supported values: "Warn", "Deny"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatal("want an error")
			}
			got := err.Error()
			if got != tc.want {
				t.Errorf("error\n %q\nwant\n %q", got, tc.want)
			}
		})
	}
}
