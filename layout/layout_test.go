package layout

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

var rules = Rules{
	HostPathAllowlist: []AllowedPath{
		{Path: "/usr/local/nvidia"},
		{Path: "/usr/lib/nvidia-*"},
		{Path: "/usr/lib/x86_64-linux-gnu", FilesOnly: true},
		{Path: "/usr/bin", FilesOnly: true},
	},
	DriverFilePatterns: []string{"libcuda.so*", "libnvidia-*.so*", "nvidia-smi"},
	ContainerPathRoots: []string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/bin"},
}

func plan(mounts ...Mount) Plan {
	return Plan{SchemaVersion: SchemaVersion, DriverVersion: "580.159.04", Mounts: mounts, LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
}

func TestValidate(t *testing.T) {
	lib := "/usr/local/nvidia/lib64"
	tests := map[string]struct {
		plan    Plan
		wantErr string // substring of the aggregate error; "" means valid
	}{
		"dedicated folder whole":       {plan: plan(Mount{"/usr/local/nvidia/lib64", lib, KindDirectory})},
		"nvidia-384 by pattern":        {plan: plan(Mount{"/usr/lib/nvidia-384", lib, KindDirectory})},
		"nvidia-384 bin below pattern": {plan: plan(Mount{"/usr/lib/nvidia-384/bin", "/usr/local/nvidia/bin", KindDirectory})},
		"driver file in shared folder": {plan: plan(Mount{"/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", lib + "/libcuda.so.1", KindFile})},
		"root":                         {plan: plan(Mount{"/", lib, KindDirectory}), wantErr: "must not be the root folder"},
		"etc":                          {plan: plan(Mount{"/etc", lib, KindDirectory}), wantErr: "not under the host path allowlist"},
		"dotdot":                       {plan: plan(Mount{"/usr/local/nvidia/../../etc", lib, KindDirectory}), wantErr: "must be a clean path"},
		"relative":                     {plan: plan(Mount{"usr/local/nvidia", lib, KindDirectory}), wantErr: "must be an absolute path"},
		"trailing slash":               {plan: plan(Mount{"/usr/local/nvidia/", lib, KindDirectory}), wantErr: "must be a clean path"},
		"prefix is not a parent":       {plan: plan(Mount{"/usr/local/nvidia-evil", lib, KindDirectory}), wantErr: "not under the host path allowlist"},
		"shared folder whole":          {plan: plan(Mount{"/usr/lib/x86_64-linux-gnu", lib, KindDirectory}), wantErr: "not under the host path allowlist"},
		"non-driver file in shared":    {plan: plan(Mount{"/usr/lib/x86_64-linux-gnu/libc.so.6", lib + "/libc.so.6", KindFile}), wantErr: "not under the host path allowlist"},
		"file deeper in shared":        {plan: plan(Mount{"/usr/lib/x86_64-linux-gnu/sub/libcuda.so.1", lib + "/libcuda.so.1", KindFile}), wantErr: "not under the host path allowlist"},
		"shell over container bin":     {plan: plan(Mount{"/usr/local/nvidia/bin", "/bin", KindDirectory}), wantErr: "not under the container mount points"},
		"container root":               {plan: plan(Mount{"/usr/local/nvidia/lib64", "/", KindDirectory}), wantErr: "must not be the root folder"},
		"container path escapes":       {plan: plan(Mount{"/usr/local/nvidia/lib64", lib + "/../../../etc", KindDirectory}), wantErr: "must be a clean path"},
		"file at the container root":   {plan: plan(Mount{"/usr/bin/nvidia-smi", "/usr/local/nvidia/bin", KindFile}), wantErr: "not under the container mount points"},
		"newline":                      {plan: plan(Mount{"/usr/local/nvidia/lib64\n", lib, KindDirectory}), wantErr: "must not contain NUL"},
		"bad kind":                     {plan: plan(Mount{"/usr/local/nvidia/lib64", lib, "Socket"}), wantErr: "Unsupported value"},
		"duplicate container path":     {plan: plan(Mount{"/usr/local/nvidia/lib64", lib, KindDirectory}, Mount{"/usr/lib/nvidia-384", lib, KindDirectory}), wantErr: "Duplicate value"},
		"no mounts":                    {plan: plan(), wantErr: "at least one mount"},
		"library path outside":         {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", Mounts: []Mount{{"/usr/local/nvidia/lib64", lib, KindDirectory}}, LibraryPaths: []string{"/lib"}}, wantErr: "libraryPaths[0]"},
		"library path with colon":      {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", Mounts: []Mount{{"/usr/local/nvidia/lib64", lib, KindDirectory}}, LibraryPaths: []string{lib + ":/lib"}}, wantErr: "must not contain ':'"},
		"no driver version":            {plan: Plan{SchemaVersion: SchemaVersion, Mounts: []Mount{{"/usr/local/nvidia/lib64", lib, KindDirectory}}}, wantErr: "driverVersion: Required"},
		"toolkit node":                 {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeToolkit}},
		"CDI node":                     {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeCDI}},
		// GKE's device plugin mounts the driver in its Allocate answer.
		"device-plugin node":              {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin}},
		"device-plugin node with mounts":  {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin, Mounts: []Mount{{"/home/kubernetes/bin/nvidia", "/usr/local/nvidia/lib64", KindDirectory}}}, wantErr: "publishes no mounts"},
		"device-plugin node with LD path": {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin, LibraryPaths: []string{lib}}},
		// The library paths come from the node: a folder outside the
		// container paths would put the image's own files on LD_LIBRARY_PATH.
		"device-plugin node with LD path outside":   {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin, LibraryPaths: []string{"/usr/lib"}}, wantErr: `libraryPaths[0]: Forbidden: "/usr/lib" is not under the container mount points`},
		"device-plugin node with LD path unclean":   {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin, LibraryPaths: []string{lib + "/../../../../etc"}}, wantErr: "libraryPaths[0]"},
		"device-plugin node with LD path and colon": {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeDevicePlugin, LibraryPaths: []string{lib + ":/lib"}}, wantErr: "must not contain ':'"},
		"toolkit node with LD path":                 {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeToolkit, LibraryPaths: []string{lib}}, wantErr: "publishes no mounts and no library paths"},
		"CDI node with LD path":                     {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: RuntimeCDI, LibraryPaths: []string{lib}}, wantErr: "publishes no mounts and no library paths"},
		"unknown injection":                         {plan: Plan{SchemaVersion: SchemaVersion, DriverVersion: "1", RuntimeInjection: "gke"}, wantErr: `Unsupported value: "gke": supported values: "toolkit", "cdi", "device-plugin"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			errs := tc.plan.Validate(rules)
			if tc.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("want valid, got %v", errs)
				}
				return
			}
			if len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), tc.wantErr) {
				t.Fatalf("want an error containing %q, got %v", tc.wantErr, errs)
			}
		})
	}
}

func TestEncodeDecodeFingerprint(t *testing.T) {
	a := plan(Mount{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib64", KindDirectory}, Mount{"/usr/local/nvidia/bin", "/usr/local/nvidia/bin", KindDirectory})
	b := plan(a.Mounts[1], a.Mounts[0])
	if a.Fingerprint() != b.Fingerprint() {
		t.Errorf("mount order changed the fingerprint")
	}
	if len(a.Fingerprint()) != 20 {
		t.Errorf("fingerprint %q: want 20 hex characters", a.Fingerprint())
	}
	c := a
	c.DriverVersion = "580.159.05"
	if a.Fingerprint() == c.Fingerprint() {
		t.Errorf("driver version did not change the fingerprint")
	}
	s, err := Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	if got.Fingerprint() != a.Fingerprint() || got.Mounts[0].ContainerPath != "/usr/local/nvidia/bin" {
		t.Errorf("round trip: %+v", got)
	}
	if b.Mounts[0].ContainerPath != "/usr/local/nvidia/bin" {
		t.Errorf("Encode reordered its argument's mounts")
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"garbage":       {`{"schemaVersion":"v1","mounts":[`, "failed to decode layout"},
		"unknown field": {`{"schemaVersion":"v1","driverVersion":"1","mounts":[],"evil":true}`, `unknown field "evil"`},
		"trailing data": {`{"schemaVersion":"v1","driverVersion":"1","mounts":[]} {}`, "trailing data"},
		"future schema": {`{"schemaVersion":"v2","driverVersion":"1","mounts":[]}`, `unsupported schemaVersion "v2"`},
		"not an object": {`[]`, "failed to decode layout"},
		"too large":     {`{"x":"` + strings.Repeat("a", MaxAnnotationBytes) + `"}`, "exceeds the limit"},
		"empty":         {``, "failed to decode layout"},
		"wrong type":    {`{"schemaVersion":"v1","mounts":"/"}`, "failed to decode layout"},
		"no schema":     {`{"driverVersion":"1","mounts":[]}`, `unsupported schemaVersion ""`},
		// json.Decoder.More is false before a closing bracket, so a decoder
		// that asks it alone takes these for one object.
		"a closing brace after":   {`{"schemaVersion":"v1","driverVersion":"1","mounts":[]}}`, "trailing data"},
		"a closing bracket after": {`{"schemaVersion":"v1","driverVersion":"1","mounts":[]}]`, "trailing data"},
		// encoding/json lets the last of two keys win, and matches a key
		// to a field in any case: another reader would see another plan.
		"a key twice":                   {`{"schemaVersion":"v1","driverVersion":"1","driverVersion":"2","mounts":[]}`, `duplicate field "driverVersion"`},
		"a mount's key twice":           {`{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostPath":"/usr/local/nvidia","hostPath":"/etc","containerPath":"/usr/local/nvidia","kind":"Directory"}]}`, `duplicate field "mounts[0].hostPath"`},
		"a key in another case":         {`{"schemaVersion":"v1","driverVersion":"1","DriverVersion":"2","mounts":[]}`, `unknown field "DriverVersion"`},
		"a mount's key in another case": {`{"schemaVersion":"v1","driverVersion":"1","mounts":[{"hostpath":"/etc","containerPath":"/usr/local/nvidia","kind":"Directory"}]}`, `unknown field "mounts[0].hostpath"`},
		// U+017F LATIN SMALL LETTER LONG S folds to "s" in encoding/json.
		"a key folded by Unicode": {`{"schemaVerſion":"v1","driverVersion":"1","mounts":[]}`, "unknown field"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestInjectedString(t *testing.T) {
	got := Injected{Fingerprint: "abc", DriverVersion: "384.130", Containers: []string{"a"}, Volumes: []string{"v<1>"}}.String()
	want := `{"fingerprint":"abc","driverVersion":"384.130","containers":["a"],"volumes":["v<1>"]}`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestParseInjected(t *testing.T) {
	good := Injected{Fingerprint: "abc", DriverVersion: "384.130", Containers: []string{"a"}, Volumes: []string{"gpu-injector-1"}}
	if got, err := ParseInjected(good.String()); err != nil || got.String() != good.String() {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if got, err := ParseInjected(`{"staticLayout":"ubuntu","driverVersion":"384.130","containers":["a"],"fromANewerRelease":1}`); err != nil || got.StaticLayout != "ubuntu" {
		t.Errorf("a newer record's fields: %+v, %v", got, err)
	}
	tests := map[string]string{
		"not JSON":              "injected by hand",
		"cut short":             `{"fingerprint":"abc","driverVe`,
		"a list":                `["abc"]`,
		"a volume not a name":   `{"fingerprint":"abc","volumes":[1]}`,
		"no layout":             `{"driverVersion":"384.130","containers":["a"]}`,
		"two layouts":           `{"fingerprint":"abc","staticLayout":"ubuntu"}`,
		"trailing data":         `{"fingerprint":"abc"} {}`,
		"a closing brace after": `{"fingerprint":"abc","driverVersion":"1","containers":["a"]}}`,
		// Another reader would see a runtime record where this one sees a
		// fingerprint, or the other way round.
		"a key twice":                       `{"fingerprint":"abc","driverVersion":"1","containers":["a"],"fingerprint":"def"}`,
		"an unknown key twice":              `{"fingerprint":"abc","driverVersion":"1","containers":["a"],"x":1,"x":2}`,
		"a key twice, nested":               `{"fingerprint":"abc","driverVersion":"1","containers":["a"],"x":{"y":1,"y":2}}`,
		"a key in another case":             `{"Fingerprint":"abc","driverVersion":"1","containers":["a"]}`,
		"a key in another case, besides it": `{"fingerprint":"abc","driverVersion":"1","containers":["a"],"Containers":["b"]}`,
		"a key folded by Unicode":           `{"fingerprint":"abc","driverVerſion":"1","containers":["a"]}`,
		"oversize":                          `{"fingerprint":"` + strings.Repeat("a", MaxAnnotationBytes) + `"}`,
		"empty":                             "",
		"an empty JSON object":              "{}",
	}
	for name, s := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseInjected(s); err == nil || !strings.HasPrefix(err.Error(), "failed to read the injection record") {
				t.Errorf("err = %v, want one that says the record is unreadable", err)
			}
		})
	}
}

// FuzzDecode feeds node-published annotation values to the decoder and the
// validator: never a panic; whatever decodes, encoding/json reads as the
// same plan (no reader sees another one), and it re-encodes to a value that
// decodes to the same fingerprint.
func FuzzDecode(f *testing.F) {
	good, _ := Encode(plan(Mount{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", KindFile}))
	for _, s := range []string{good, `{}`, `{"schemaVersion":"v1"}`, `{"schemaVersion":"v1","mounts":[{"hostPath":"/","containerPath":"/","kind":"Directory"}]}`, `null`, `"x"`, `{"schemaVersion":"v1","libraryPaths":[":"]}`,
		good + "}", strings.Replace(good, `"driverVersion"`, `"DriverVersion"`, 1), strings.Replace(good, `{"schemaVersion":"v1"`, `{"schemaVersion":"v1","schemaVersion":"v2"`, 1),
		strings.Replace(good, `"kind"`, `"Kind"`, 1), strings.Replace(good, `"hostPath"`, `"hoſtPath"`, 1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Decode(s)
		if err != nil {
			return
		}
		var other Plan
		if err := json.Unmarshal([]byte(s), &other); err != nil || !reflect.DeepEqual(p, other) {
			t.Fatalf("encoding/json reads %+v (%v), Decode %+v", other, err, p)
		}
		_ = p.Validate(rules)
		again, err := Encode(p)
		if err != nil {
			t.Fatalf("failed to re-encode a decoded plan: %v", err)
		}
		q, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded plan does not decode: %v", err)
		}
		if p.Fingerprint() != q.Fingerprint() {
			t.Fatalf("fingerprint changed over a round trip")
		}
	})
}

// FuzzParseInjected feeds pod annotation values to the injection record's
// reader: never a panic; whatever it accepts, encoding/json reads as the same
// record, which names one layout and writes back to a value read alike.
func FuzzParseInjected(f *testing.F) {
	good := Injected{Fingerprint: "abc", DriverVersion: "384.130", Containers: []string{"a"}, Volumes: []string{"gpu-injector-1"}}.String()
	for _, s := range []string{good, `{"runtime":"nri","containers":["a"]}`, `{"staticLayout":"ubuntu","driverVersion":"1","containers":[],"new":{"a":1}}`,
		`{}`, `null`, `[]`, good + "}", good + " {}", strings.Replace(good, `"fingerprint"`, `"Fingerprint"`, 1),
		strings.Replace(good, `{"fingerprint":"abc"`, `{"fingerprint":"abc","runtime":"nri","fingerprint":""`, 1), `{"runtime":"nri","runtime":"other"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		i, err := ParseInjected(s)
		if err != nil {
			if !reflect.DeepEqual(i, Injected{}) {
				t.Fatalf("a record %+v with the error %v", i, err)
			}
			return
		}
		var other Injected
		if err := json.Unmarshal([]byte(s), &other); err != nil || !reflect.DeepEqual(i, other) {
			t.Fatalf("encoding/json reads %+v (%v), ParseInjected %+v", other, err, i)
		}
		again, err := ParseInjected(i.String())
		if err != nil || !reflect.DeepEqual(again, i) {
			t.Fatalf("written back as %s, read as %+v (%v), want %+v", i.String(), again, err, i)
		}
	})
}

func TestCUDAVersionNumber(t *testing.T) {
	for v, want := range map[string]int{"12.4": 12040, "9.2": 9020, "13.0": 13000, "8.0": 8000, "12.10": 12100, "0.0": 0} {
		if got, ok := CUDAVersionNumber(v); !ok || got != want {
			t.Errorf("CUDAVersionNumber(%q) = %d, %v; want %d", v, got, ok, want)
		}
	}
	// The encoding has room for two digits of minor and nothing after it.
	for _, v := range []string{"", "12", "12.", ".4", "12.4.1", "12.100", "v12.4", "12.-4", "+1.2", "1234567.0", "12.4 "} {
		if got, ok := CUDAVersionNumber(v); ok {
			t.Errorf("CUDAVersionNumber(%q) = %d, want not ok", v, got)
		}
	}
}
