package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := map[string]struct {
		args       []string
		code       int
		wantOut    string
		wantStderr string
	}{
		"no command":       {args: nil, code: 2, wantStderr: "Usage:"},
		"unknown command":  {args: []string{"inject"}, code: 2, wantStderr: `unknown command "inject"`},
		"version":          {args: []string{"version"}, code: 0, wantOut: "dev"},
		"help":             {args: []string{"help"}, code: 0, wantOut: "gpu-injector config validate -f FILE"},
		"mutate bad flags": {args: []string{"mutate", "-f", "x.yaml"}, code: 2, wantStderr: "-f and --nodes are required"},
		"mutate -h":        {args: []string{"mutate", "-h"}, code: 0, wantStderr: "Usage: gpu-injector mutate"},
		"nodeprobe bad":    {args: []string{"nodeprobe", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"webhook bad":      {args: []string{"webhook", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"nri-plugin bad":   {args: []string{"nri-plugin", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"status bad":       {args: []string{"status", "-o", "wide"}, code: 2, wantStderr: "want table, json or yaml"},
		"precheck bad":     {args: []string{"precheck", "-o", "wide"}, code: 2, wantStderr: "want table, json or yaml"},
		"precheck no file": {args: []string{"precheck", "-f", "/nonexistent/nodes.yaml"}, code: 1, wantStderr: "no such file"},
		"mutate no file":   {args: []string{"mutate", "-f", "/nonexistent/x.yaml", "--nodes", "/nonexistent/n.yaml"}, code: 1, wantStderr: "no such file"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &out, &errb)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stdout %q lacks %q", out.String(), tc.wantOut)
			}
			if !strings.Contains(errb.String(), tc.wantStderr) {
				t.Errorf("stderr %q lacks %q", errb.String(), tc.wantStderr)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "apiVersion: config.gpu-injector.io/v1alpha1\nkind: InjectorConfiguration\nldLibraryPath: Prepend\n")
	bad := write("bad.yaml", "noLayout: {action: Static}\nexcludedNamespaces: [Kube]\n")
	rendered := "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: sa}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: gpu-injector-config, namespace: gpu-injector}\ndata:\n  config.yaml: |\n    noLayout: {action: Static}\n"
	tests := map[string]struct {
		args       []string
		stdin      string
		code       int
		wantOut    string
		wantStderr []string
	}{
		"valid":       {args: []string{"config", "validate", "-f", good}, code: 0, wantOut: good + ": valid configuration"},
		"every error": {args: []string{"config", "validate", "-f", bad}, code: 1, wantStderr: []string{bad + ": invalid configuration:\n", "\n  noLayout.staticLayout: Required value: in noLayout, on line 1; the name of a staticLayouts entry, with action Static\n", "\n  excludedNamespaces[0]: Invalid value: \"Kube\": on line 2; "}},
		// Two typos and two invalid values: all four at once, each with its line, in
		// the file's order.
		"typos and invalid values": {args: []string{"config", "validate", "-f", "-"}, stdin: "ldLibaryPath: Prepend\npodSecurity: Block\ncontainerPaths:\n  libaryDir: /l\n  binaryDir: bin\n", code: 1, wantStderr: []string{
			"standard input: invalid configuration:\n" +
				"  ldLibaryPath: Forbidden: unknown field, on line 1; did you mean ldLibraryPath?\n" +
				"  podSecurity: Unsupported value: \"Block\": on line 2; supported values: \"Warn\", \"Deny\"\n" +
				"  containerPaths.libaryDir: Forbidden: unknown field, on line 4; did you mean libraryDir?\n" +
				"  containerPaths.binaryDir: Invalid value: \"bin\": on line 5; must be an absolute, clean path other than / without ':'\n"}},
		"a boolean": {args: []string{"config", "validate", "-f", "-"}, stdin: "podSecurity: yes\n", code: 1, wantStderr: []string{
			"  podSecurity: Invalid value: on line 1; podSecurity: yes is read as a boolean (YAML 1.1); quote it: podSecurity: \"Warn\" or podSecurity: \"Deny\"\n"}},
		"stdin": {args: []string{"config", "validate", "-f", "-"}, stdin: rendered, code: 1, wantStderr: []string{"standard input: ConfigMap gpu-injector/gpu-injector-config: invalid configuration:\n  noLayout.staticLayout: Required value"}},
		"unknown fields": {args: []string{"config", "validate", "-f", "-"}, stdin: "ldLibaryPath: Prepend\ncontainerPaths:\n  libaryDir: /l\n", code: 1, wantStderr: []string{
			"standard input: invalid configuration:\n  ldLibaryPath: Forbidden: unknown field, on line 1; did you mean ldLibraryPath?\n  containerPaths.libaryDir: Forbidden: unknown field, on line 3; did you mean libraryDir?\n"}},
		"empty stdin":   {args: []string{"config", "validate", "-f", "-"}, stdin: "", code: 1, wantStderr: []string{"standard input is empty: no gpu-injector configuration", "(did the command before the pipe fail?)"}},
		"nothing":       {args: []string{"config", "validate", "-f", "-"}, stdin: "apiVersion: v1\nkind: Namespace\n", code: 1, wantStderr: []string{"no gpu-injector configuration"}},
		"missing file":  {args: []string{"config", "validate", "-f", filepath.Join(dir, "none")}, code: 1, wantStderr: []string{"failed to read"}},
		"no -f":         {args: []string{"config", "validate"}, code: 2, wantStderr: []string{"-f FILE is required"}},
		"extra args":    {args: []string{"config", "validate", "-f", good, "more"}, code: 2, wantStderr: []string{"-f FILE is required"}},
		"bad flag":      {args: []string{"config", "validate", "--strict"}, code: 2, wantStderr: []string{"flag provided but not defined: -strict"}},
		"no subcommand": {args: []string{"config"}, code: 2, wantStderr: []string{"Usage: gpu-injector config validate"}},
		"unknown":       {args: []string{"config", "check"}, code: 2, wantStderr: []string{"Usage: gpu-injector config validate"}},
		"help":          {args: []string{"config", "validate", "-h"}, code: 0, wantStderr: []string{"Exit status: 0 valid"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, strings.NewReader(tc.stdin), &out, &errb)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stdout %q lacks %q", out.String(), tc.wantOut)
			}
			for _, w := range tc.wantStderr {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr %q lacks %q", errb.String(), w)
				}
			}
		})
	}
}

func TestCommandLineAsKubectlPlugin(t *testing.T) {
	for _, tc := range []struct {
		argv0 string
		args  []string
		want  []string
	}{
		{"/usr/local/bin/gpu-injector", []string{"mutate", "-h"}, []string{"mutate", "-h"}},
		{"/home/u/.krew/bin/kubectl-gpu_injector", nil, []string{"status"}},
		{"/home/u/.krew/bin/kubectl-gpu_injector", []string{"-o", "json"}, []string{"status", "-o", "json"}},
		{"kubectl-gpu_injector", []string{"status", "--context", "prod"}, []string{"status", "--context", "prod"}},
		{"kubectl-gpu_injector", []string{"version"}, []string{"version"}},
		{"kubectl-gpu_injector", []string{"mutate"}, []string{"status", "mutate"}},
	} {
		if got := commandLine(tc.argv0, tc.args); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("commandLine(%q, %q) = %q, want %q", tc.argv0, tc.args, got, tc.want)
		}
	}
}
