package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// machineBounding is CapBnd of a root without CAP_SYS_RESOURCE (bit 24).
const machineBounding = 0x000001fffeffffff

func TestBoundingSet(t *testing.T) {
	got, err := boundingSet("Name:\tx\nCapInh:\t0000000000000000\nCapBnd:\t000001fffeffffff\nCapAmb:\t0000000000000000\n")
	if err != nil || got != machineBounding {
		t.Fatalf("boundingSet = %#x, %v; want %#x", got, err, uint64(machineBounding))
	}
	for _, bad := range []string{"Name:\tx\n", "CapBnd:\tzz\n"} {
		if _, err := boundingSet(bad); err == nil {
			t.Errorf("boundingSet(%q) = nil error", bad)
		}
	}
}

func TestSpecFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p", "id"}, "/b/config.json"},
		{[]string{"--systemd-cgroup", "create", "--bundle=/b", "id"}, "/b/config.json"},
		{[]string{"run", "-b", "/b", "id"}, "/b/config.json"},
		{[]string{"create", "id"}, "config.json"},
		{[]string{"--root", "/r", "exec", "--pid-file", "/p", "--process", "/tmp/proc.json", "-d", "id"}, "/tmp/proc.json"},
		{[]string{"exec", "-p", "/tmp/proc.json", "id"}, "/tmp/proc.json"},
		{[]string{"exec", "id", "sh"}, ""},
		// "create" as another flag's value or another command's argument.
		{[]string{"--root", "create", "state", "id"}, ""},
		{[]string{"kill", "create", "KILL"}, ""},
		{[]string{"--version"}, ""},
	} {
		if got := specFile(tc.args); got != tc.want {
			t.Errorf("specFile(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

// allCaps is what CRI-O writes for a privileged container on a kernel whose
// last capability is CAP_CHECKPOINT_RESTORE: every one.
func allCaps() []string {
	var names []string
	for n := range capabilityBits {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func TestRestrictSpecPrivileged(t *testing.T) {
	all := allCaps()
	spec := map[string]any{
		"ociVersion": "1.2.1",
		"process": map[string]any{
			"args": []string{"/bin/sh"},
			"capabilities": map[string]any{
				"bounding": all, "effective": all, "permitted": all, "inheritable": []string{"CAP_SYS_RESOURCE"},
			},
			"oomScoreAdj": -997,
		},
		"annotations": map[string]string{"k": "v"},
	}
	data, _ := json.Marshal(spec)
	out, changed, err := restrictSpec(data, machineBounding)
	if err != nil || !changed {
		t.Fatalf("restrictSpec: changed %v, %v", changed, err)
	}
	var got struct {
		OCIVersion  string            `json:"ociVersion"`
		Annotations map[string]string `json:"annotations"`
		Process     struct {
			Args         []string            `json:"args"`
			OOMScoreAdj  int                 `json:"oomScoreAdj"`
			Capabilities map[string][]string `json:"capabilities"`
		} `json:"process"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return n == "CAP_SYS_RESOURCE" })
	for _, set := range []string{"bounding", "effective", "permitted"} {
		if !slices.Equal(got.Process.Capabilities[set], want) {
			t.Errorf("%s = %v, want %v", set, got.Process.Capabilities[set], want)
		}
	}
	if c, ok := got.Process.Capabilities["inheritable"]; !ok || len(c) != 0 {
		t.Errorf("inheritable = %v (present %v), want []", c, ok)
	}
	if _, ok := got.Process.Capabilities["ambient"]; ok {
		t.Errorf("ambient appeared: %v", got.Process.Capabilities["ambient"])
	}
	if got.OCIVersion != "1.2.1" || got.Annotations["k"] != "v" || got.Process.OOMScoreAdj != -997 || !slices.Equal(got.Process.Args, []string{"/bin/sh"}) {
		t.Errorf("other fields changed: %s", out)
	}
}

func TestRestrictSpecUnchanged(t *testing.T) {
	for name, data := range map[string]string{
		"held only":       `{"process":{"capabilities":{"bounding":["CAP_CHOWN","CAP_NET_BIND_SERVICE"],"effective":["CAP_CHOWN"]}}}`,
		"no capabilities": `{"process":{"args":["x"]}}`,
		"null":            `{"process":{"capabilities":null}}`,
		"unknown name":    `{"process":{"capabilities":{"bounding":["CAP_FUTURE"]}}}`,
	} {
		out, changed, err := restrictSpec([]byte(data), machineBounding)
		if err != nil || changed || string(out) != data {
			t.Errorf("%s: restrictSpec = %s, %v, %v; want the input unchanged", name, out, changed, err)
		}
	}
	// The full set keeps everything, even CAP_SYS_RESOURCE.
	data := `{"process":{"capabilities":{"bounding":["CAP_SYS_RESOURCE"]}}}`
	if _, changed, err := restrictSpec([]byte(data), 1<<41-1); err != nil || changed {
		t.Errorf("full bounding set: changed %v, %v", changed, err)
	}
	if _, _, err := restrictSpec([]byte(`{"process":{"capabilities":{"bounding":"CAP_CHOWN"}}}`), machineBounding); err == nil {
		t.Error("a set that is not a list: no error")
	}
}

// TestRestrictFileExecProcess: an exec's --process file is the process
// object itself, and the file keeps its mode.
func TestRestrictFileExecProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "process.json")
	if err := os.WriteFile(path, []byte(`{"args":["ls"],"capabilities":{"effective":["CAP_SYS_RESOURCE","CAP_KILL"],"ambient":["cap_sys_resource"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := restrictFile(path, machineBounding); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	var got struct {
		Args         []string            `json:"args"`
		Capabilities map[string][]string `json:"capabilities"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Capabilities["effective"], []string{"CAP_KILL"}) || len(got.Capabilities["ambient"]) != 0 || !slices.Equal(got.Args, []string{"ls"}) {
		t.Errorf("got %s", data)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", info.Mode().Perm())
	}
}
