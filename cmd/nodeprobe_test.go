//go:build cgo

package cmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/gpu-injector/gpu-injector/nodeprobe"
)

func TestNodeProbeFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "gpu-1")
	f, err := parseNodeProbeFlags([]string{"--host-root=/h", "--nvml-timeout=7s", "--state-dir=/run/gi", "--ignore-runtime-injection"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := f.opts
	if o.NodeName != "gpu-1" || o.Interval != 5*time.Minute || o.StateDir != "/run/gi" || o.HealthAddr != ":8082" || o.MetricsAddr != ":8083" ||
		o.Probe.HostRoot != "/h" || !o.Probe.IgnoreRuntimeInjection || o.Probe.NVMLWatch == nil || o.Probe.NVMLWatch.Timeout != 7*time.Second {
		t.Errorf("flags not applied: %+v", o)
	}
	if f, err = parseNodeProbeFlags(nil, io.Discard); err != nil || f.opts.Probe.NVMLWatch.Timeout != nodeprobe.DefaultNVMLTimeout {
		t.Errorf("default NVML limit: %v, %+v", err, f)
	}
}

func TestNodeProbeFlagErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"unknown flag":       {"--nope"},
		"bad output":         {"--once", "-o", "xml"},
		"no node name":       {"--node-name="},
		"bad interval":       {"--once", "--interval", "0s"},
		"stray argument":     {"--once", "extra"},
		"malformed duration": {"--interval", "soon"},
		"bad nvml timeout":   {"--once", "--nvml-timeout", "0s"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			err := NodeProbe(context.Background(), args, io.Discard, io.Discard)
			if !errors.Is(err, ErrUsage) {
				t.Errorf("NodeProbe(%q) = %v, want ErrUsage", args, err)
			}
		})
	}
	var help bytes.Buffer
	if err := NodeProbe(context.Background(), []string{"-h"}, io.Discard, &help); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v, want flag.ErrHelp", err)
	}
	checkHelp(t, help.String())
	if err := NodeProbe(context.Background(), []string{"--once", "--config", "/does/not/exist"}, io.Discard, io.Discard); err == nil || errors.Is(err, ErrUsage) {
		t.Errorf("missing config = %v, want a plain error", err)
	}
}
