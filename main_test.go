package main

import (
	"bytes"
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
		"help":             {args: []string{"help"}, code: 0, wantOut: "gpu-injector mutate -f FILE"},
		"mutate bad flags": {args: []string{"mutate", "-f", "x.yaml"}, code: 2, wantStderr: "-f and --nodes are required"},
		"mutate -h":        {args: []string{"mutate", "-h"}, code: 0, wantStderr: "Usage: gpu-injector mutate"},
		"nodeprobe bad":    {args: []string{"nodeprobe", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"webhook bad":      {args: []string{"webhook", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"nri-plugin bad":   {args: []string{"nri-plugin", "--no-such-flag"}, code: 2, wantStderr: "no-such-flag"},
		"status bad":       {args: []string{"status", "-o", "wide"}, code: 2, wantStderr: "want table, json or yaml"},
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
