package cmd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/status"
)

func TestParsePrecheckFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args  []string
		usage bool
	}{
		"online":                 {args: []string{"--namespace", "gpu-injector", "--dry-run-namespace", "gpu-injector-test", "-o", "json"}},
		"offline":                {args: []string{"-f", "cluster.yaml", "--config", "cfg.yaml", "--namespace", "gpu-injector"}},
		"bad output":             {args: []string{"-o", "wide"}, usage: true},
		"an argument":            {args: []string{"nodes"}, usage: true},
		"offline with a context": {args: []string{"-f", "cluster.yaml", "--context", "prod"}, usage: true},
		"offline dry run":        {args: []string{"-f", "cluster.yaml", "--dry-run-namespace", "ml"}, usage: true},
		"unknown flag":           {args: []string{"--color", "never"}, usage: true},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parsePrecheckFlags(tc.args, io.Discard)
			if got := errors.Is(err, ErrUsage); got != tc.usage || !tc.usage && err != nil {
				t.Errorf("error %v, want a usage error: %v", err, tc.usage)
			}
		})
	}
}

// TestPrecheckOffline: the offline example needs attention (exit 3); a
// file or configuration that cannot be read is exit 1, a bad command line 2.
func TestPrecheckOffline(t *testing.T) {
	example := filepath.Join("..", "precheck", "testdata", "cluster.yaml")
	cfg := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(cfg, []byte("driverDelivery: HostPath\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		code int
		out  string
	}{
		"example":       {args: []string{"-f", example}, code: status.ExitAttention, out: "NEEDS ATTENTION"},
		"with a config": {args: []string{"-f", example, "--config", cfg, "-o", "yaml"}, code: status.ExitAttention, out: "source: file " + cfg},
		"no file":       {args: []string{"-f", filepath.Join(t.TempDir(), "none.yaml")}, code: status.ExitError},
		"no config":     {args: []string{"-f", example, "--config", filepath.Join(t.TempDir(), "none.yaml")}, code: status.ExitError},
		"usage":         {args: []string{"-o", "wide"}, code: status.ExitUsage},
		"help":          {args: []string{"-h"}, code: status.ExitOK},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Precheck(context.Background(), tc.args, strings.NewReader(""), &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.out) {
				t.Errorf("exit %d, want %d; stdout:\n%s\nstderr:\n%s", code, tc.code, out.String(), errb.String())
			}
		})
	}
}
