package cmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpu-injector/gpu-injector/status"
	"github.com/gpu-injector/gpu-injector/webhook/server"
)

func TestWebhookFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "gpu-injector")
	f, err := parseWebhookFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := webhookFlags{
		logLevel: "info", logFormat: "json",
		opts: server.Options{
			Port: 9443, MetricsAddr: ":8080", ProbeAddr: ":8081", PoolMemory: "gpu-injector-pools", ShutdownDelay: 5 * time.Second,
			MaxInFlight: server.DefaultMaxInFlight, ReadTimeout: server.DefaultReadTimeout,
			Certs: server.CertOptions{
				Mode: server.CertModeSelf, Dir: "/tmp/k8s-webhook-server/serving-certs", SecretName: "gpu-injector-webhook-tls",
				Namespace: "gpu-injector", ServiceName: "gpu-injector-webhook", WebhookConfigName: "gpu-injector",
			},
		},
	}
	if !reflect.DeepEqual(*f, want) {
		t.Errorf("defaults = %+v, want %+v", *f, want)
	}

	f, err = parseWebhookFlags([]string{"--cert-mode=external", "--namespace=infra", "--port=10250", "--log-format=console", "--log-level=debug", "--webhook-configuration-name=gi", "--cert-extra-dns-names=localhost, gi.example.com"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	c := f.opts.Certs
	if c.Mode != server.CertModeExternal || c.Namespace != "infra" || f.opts.Port != 10250 || c.WebhookConfigName != "gi" ||
		strings.Join(c.ExtraDNSNames, ",") != "localhost,gi.example.com" {
		t.Errorf("flags not applied: %+v", *f)
	}
}

func TestWebhookFlagErrors(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"cert mode":   {[]string{"--cert-mode=manual"}, `unknown --cert-mode "manual"`},
		"log level":   {[]string{"--log-level=trace"}, `unknown --log-level "trace"`},
		"log format":  {[]string{"--log-format=xml"}, `unknown --log-format "xml"`},
		"port":        {[]string{"--port=70000"}, "not a TCP port"},
		"delay":       {[]string{"--shutdown-delay=-1s"}, "is negative"},
		"stray arg":   {[]string{"serve"}, "unexpected arguments"},
		"unknown":     {[]string{"--nope"}, "flag provided but not defined: -nope"},
		"not integer": {[]string{"--port=https"}, "invalid value"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := parseWebhookFlags(tc.args, &bytes.Buffer{})
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
}

func TestWebhookFailsEarly(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: config.gpu-injector.io/v1alpha1\nkind: InjectorConfiguration\nlayoutPolicy: Random\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		args []string
		want string
	}{
		"help":           {[]string{"-h"}, flag.ErrHelp.Error()},
		"bad config":     {[]string{"--config=" + bad}, "layoutPolicy"},
		"missing config": {[]string{"--config=" + filepath.Join(dir, "none.yaml")}, "failed to read configuration"},
		"bad kubeconfig": {[]string{"--kubeconfig=" + filepath.Join(dir, "none"), "--log-format=console"}, "failed to load kubeconfig"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := Webhook(context.Background(), tc.args, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
			if name != "help" && errors.Is(err, ErrUsage) {
				t.Errorf("%v is a usage error; only a bad command line is", err)
			}
			if name == "help" && !strings.Contains(stderr.String(), "-cert-mode") {
				t.Errorf("help does not list the flags: %s", stderr.String())
			}
		})
	}
}

func TestNRIPluginFlags(t *testing.T) {
	f, err := parseNRIPluginFlags([]string{"--plugin-index=07"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o := f.opts; o.Socket != "/var/run/nri/nri.sock" || o.StateDir != "/run/gpu-injector" || o.PluginIndex != "07" || o.HealthAddr != ":8084" || o.MetricsAddr != ":8085" {
		t.Errorf("flags not applied: %+v", o)
	}
	for name, args := range map[string][]string{
		"unknown flag":   {"--nope"},
		"no state dir":   {"--state-dir="},
		"no socket":      {"--socket="},
		"one digit":      {"--plugin-index=5"},
		"not digits":     {"--plugin-index=a1"},
		"stray argument": {"extra"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseNRIPluginFlags(args, io.Discard); !errors.Is(err, ErrUsage) {
				t.Errorf("%q = %v, want ErrUsage", args, err)
			}
		})
	}
}

func TestMutateFlags(t *testing.T) {
	var stderr bytes.Buffer
	f, err := parseMutateFlags([]string{"-f", "-", "--nodes", "a.yaml", "--nodes", "b.yaml"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o := f.opts; o.File != "-" || strings.Join(o.NodeFiles, ",") != "a.yaml,b.yaml" || o.Namespace != "default" {
		t.Errorf("flags not applied: %+v", o)
	}
	for name, args := range map[string][]string{
		"no nodes": {"-f", "x.yaml"},
		"no file":  {"--nodes", "n.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			stderr.Reset()
			_, err := parseMutateFlags(args, &stderr)
			if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "-f and --nodes are required") {
				t.Errorf("%q = %v, want the usage error", args, err)
			}
			if !strings.Contains(stderr.String(), "Usage: gpu-injector mutate") {
				t.Errorf("no usage printed: %s", stderr.String())
			}
		})
	}
}

func TestStatusExit(t *testing.T) {
	var stderr bytes.Buffer
	for _, args := range [][]string{{"-o", "wide"}, {"--color", "sometimes"}, {"extra"}, {"--nope"}, {"--dry-run-only"}} {
		if code := Status(context.Background(), args, &bytes.Buffer{}, &stderr); code != status.ExitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, status.ExitUsage)
		}
	}
	if code := Status(context.Background(), []string{"-h"}, &bytes.Buffer{}, &stderr); code != status.ExitOK {
		t.Errorf("-h: exit %d, want %d", code, status.ExitOK)
	}
	if code := Status(context.Background(), []string{"--kubeconfig", "/nonexistent/kubeconfig"}, &bytes.Buffer{}, &stderr); code != status.ExitError {
		t.Errorf("unreadable kubeconfig: exit %d, want %d", code, status.ExitError)
	}
}

func TestRESTConfig(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "config")
	data := `apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: "https://a.example:6443"}}
- {name: b, cluster: {server: "https://b.example:6443"}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: a, context: {cluster: a, user: u}}
- {name: b, context: {cluster: b, user: u}}
current-context: a
`
	if err := os.WriteFile(kubeconfig, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	for context, want := range map[string]string{"": "https://a.example:6443", "b": "https://b.example:6443"} {
		c, err := restConfig(kubeconfig, context)
		if err != nil || c.Host != want {
			t.Errorf("context %q: %v, %v; want host %s", context, c, err, want)
		}
	}
	if _, err := restConfig(kubeconfig, "nope"); err == nil {
		t.Error("an unknown context was accepted")
	}
	// Without a file, $KUBECONFIG is read, as kubectl does.
	t.Setenv("KUBECONFIG", kubeconfig)
	if c, err := restConfig("", "b"); err != nil || c.Host != "https://b.example:6443" {
		t.Errorf("$KUBECONFIG: %v, %v", c, err)
	}
}

func TestCleanupFlags(t *testing.T) {
	f, err := parseCleanupFlags([]string{"--namespace=gpu-injector", "--webhook-configuration-name=gpu-injector",
		"--webhook-deployment=gpu-injector-webhook", "--probe-daemonset=gpu-injector-nodeprobe",
		"--pool-memory-name=gpu-injector-pools", "--delete-pods=gpu-injector-test", "--timeout=30s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := f.opts
	if o.Namespace != "gpu-injector" || o.WebhookConfiguration != "gpu-injector" || o.WebhookDeployment != "gpu-injector-webhook" ||
		o.ProbeDaemonSet != "gpu-injector-nodeprobe" || o.PoolMemory != "gpu-injector-pools" ||
		len(o.Pods) != 1 || o.Pods[0] != "gpu-injector-test" || o.Timeout != 30*time.Second {
		t.Errorf("options %+v", o)
	}
	for _, args := range [][]string{{}, {"--webhook-deployment=x"}, {"--namespace=ns", "extra"}} {
		if _, err := parseCleanupFlags(args, io.Discard); !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
