package statedir

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-injector/gpu-injector/layout"
)

func TestLayoutRoundTrip(t *testing.T) {
	dir := t.TempDir()
	plan := layout.Plan{SchemaVersion: layout.SchemaVersion, DriverVersion: "580.159.04",
		Mounts:       []layout.Mount{{HostPath: "/usr/local/nvidia/lib64", ContainerPath: "/usr/local/nvidia/lib64", Kind: layout.KindDirectory}},
		LibraryPaths: []string{"/usr/local/nvidia/lib64"}}
	if err := WriteLayout(dir, &plan, NoLayout{}); err != nil {
		t.Fatal(err)
	}
	got, none, err := ReadLayout(dir)
	if err != nil || got == nil || !reflect.DeepEqual(*got, plan) || none != (NoLayout{}) {
		t.Fatalf("ReadLayout = %+v, %+v, %v", got, none, err)
	}
	// The bytes are the node annotation's: one encoding of a plan everywhere.
	data, _ := os.ReadFile(filepath.Join(dir, LayoutFile))
	if enc, _ := layout.Encode(plan); string(data) != enc {
		t.Errorf("layout.json %s, want %s", data, enc)
	}
	if err := WriteLayout(dir, nil, NoLayout{State: layout.StateWedged, Reason: "GPULost"}); err != nil {
		t.Fatal(err)
	}
	if got, none, err := ReadLayout(dir); err != nil || got != nil || none.State != layout.StateWedged || none.Reason != "GPULost" {
		t.Fatalf("ReadLayout = %+v, %+v, %v", got, none, err)
	}
	st, _ := os.Stat(filepath.Join(dir, LayoutFile))
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644: the plugin runs as another user", st.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d entries, want layout.json alone", len(entries))
	}
}

func TestParseLayoutRefuses(t *testing.T) {
	for name, s := range map[string]string{
		"not JSON":             "{",
		"a record with more":   `{"state":"error","reason":"x","mounts":[]}`,
		"a plan with more":     `{"schemaVersion":"v1","driverVersion":"1","mounts":[],"libraryPaths":[],"hostPID":true}`,
		"another schema":       `{"schemaVersion":"v2","driverVersion":"1","mounts":[],"libraryPaths":[]}`,
		"trailing data":        `{"state":"error"} {}`,
		"a plan under a state": `{"state":"ready","schemaVersion":"v1"}`,
	} {
		if plan, _, err := ParseLayout([]byte(s)); err == nil {
			t.Errorf("%s: ParseLayout accepted %s as %+v", name, s, plan)
		}
	}
}

func TestReadRefusesAHugeFile(t *testing.T) {
	dir := t.TempDir()
	if err := WriteFile(dir, LayoutFile, []byte(`{"state":"error","reason":"`+strings.Repeat("x", maxFileBytes)+`"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadLayout(dir); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("ReadLayout = %v", err)
	}
}

func TestPluginFile(t *testing.T) {
	dir := t.TempDir()
	if p, err := ReadPlugin(dir); p != nil || err != nil {
		t.Fatalf("no file: %+v, %v", p, err)
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	want := Plugin{Protocol: layout.NRIProtocol, RuntimeName: "containerd", RuntimeVersion: "v2.2.0", RegisteredAt: now, Heartbeat: now}
	if err := WritePlugin(dir, want); err != nil {
		t.Fatal(err)
	}
	if p, err := ReadPlugin(dir); err != nil || !reflect.DeepEqual(*p, want) || !p.Registered(now.Add(HeartbeatInterval)) {
		t.Fatalf("ReadPlugin = %+v, %v", p, err)
	}
	if err := RemovePlugin(dir); err != nil {
		t.Fatal(err)
	}
	if err := RemovePlugin(dir); err != nil {
		t.Errorf("a second removal: %v", err)
	}
	if err := WriteFile(dir, PluginFile, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPlugin(dir); err == nil {
		t.Error("read a plugin file that is not JSON")
	}
}
