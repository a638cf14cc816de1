package cmd

import (
	"context"
	"flag"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/server"
)

// webhookFlags are the webhook's flags: process plumbing, since behaviour
// lives in the config file.
type webhookFlags struct {
	opts       server.Options
	configFile string
	kubeconfig string
	logLevel   string
	logFormat  string
}

func parseWebhookFlags(args []string, stderr io.Writer) (*webhookFlags, error) {
	f := &webhookFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.configFile, "config", "", "configuration file (InjectorConfiguration YAML); empty: the defaults")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG, else in-cluster, else ~/.kube/config")
	fs.IntVar(&o.Port, "port", 9443, "HTTPS port of the webhook server")
	fs.StringVar(&o.Certs.Dir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "folder of the serving certificate files tls.crt and tls.key")
	fs.StringVar(&o.Certs.Mode, "cert-mode", server.CertModeSelf, "self: generate, rotate and inject the certificate (cert-controller); external: only load --cert-dir (cert-manager)")
	fs.StringVar(&o.Certs.SecretName, "cert-secret-name", "gpu-injector-webhook-tls", "Secret that holds the CA and serving certificate in self mode")
	fs.StringVar(&o.Certs.ServiceName, "service-name", "gpu-injector-webhook", "Service in front of the webhook: the certificate's DNS name")
	fs.Func("cert-extra-dns-names", "comma-separated extra DNS `names` of the self-made certificate, for a webhook configuration that calls a URL (e.g. localhost)", func(v string) error {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				o.Certs.ExtraDNSNames = append(o.Certs.ExtraDNSNames, n)
			}
		}
		return nil
	})
	fs.StringVar(&o.Certs.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the webhook's own namespace (default $POD_NAMESPACE); never mutated")
	fs.StringVar(&o.Certs.WebhookConfigName, "webhook-configuration-name", "gpu-injector", "MutatingWebhookConfiguration whose caBundle self mode keeps current")
	fs.StringVar(&o.PoolMemory, "pool-memory-name", "gpu-injector-pools", "ConfigMap (and leader election Lease) in --namespace that remembers each pool's layout, with config pinning.nodeLabels; empty: no memory")
	fs.StringVar(&o.PolicyBinding, "policy-binding-name", "", "MutatingAdmissionPolicyBinding of the chart's policy (driverDelivery PreferRuntime): the elected replica opens its namespaceSelector while every known GPU node delivers the driver at the runtime, and closes it otherwise; empty: none")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof endpoints, for profiling; empty (the default) disables them")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, keep serving this long with /readyz failing, so that the API server stops choosing this replica before its port closes; then finish the requests in flight and exit")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", server.DefaultMaxInFlight, "admissions served at once; a request that finds no slot within a second is answered 429 (the webhook's failurePolicy applies)")
	fs.DurationVar(&o.ReadTimeout, "read-timeout", server.DefaultReadTimeout, "how long a request's body may take to arrive after its headers")
	fs.StringVar(&o.ClientCA, "client-ca-name", "", "file in --cert-dir of the CA that signs the API server's client certificate; when set, clients without such a certificate are refused at the TLS handshake")
	fs.StringVar(&f.logLevel, "log-level", "info", "info or debug")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or console")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	switch {
	case o.Port < 1 || o.Port > 65535:
		return nil, usageErrorf("--port %d is not a TCP port", o.Port)
	case o.ShutdownDelay < 0:
		return nil, usageErrorf("--shutdown-delay %s is negative", o.ShutdownDelay)
	case o.MaxInFlight < 1:
		return nil, usageErrorf("--max-in-flight %d is below 1", o.MaxInFlight)
	case o.ReadTimeout <= 0:
		return nil, usageErrorf("--read-timeout %s is not positive", o.ReadTimeout)
	case o.Certs.Mode != server.CertModeSelf && o.Certs.Mode != server.CertModeExternal:
		return nil, usageErrorf("unknown --cert-mode %q: want %s or %s", o.Certs.Mode, server.CertModeSelf, server.CertModeExternal)
	case f.logLevel != "info" && f.logLevel != "debug":
		return nil, usageErrorf("unknown --log-level %q: want info or debug", f.logLevel)
	case f.logFormat != "json" && f.logFormat != "console":
		return nil, usageErrorf("unknown --log-format %q: want json or console", f.logFormat)
	}
	return f, nil
}

// Webhook is `gpu-injector webhook`: it serves Pod admission until ctx ends.
func Webhook(ctx context.Context, args []string, stderr io.Writer) error {
	f, err := parseWebhookFlags(args, stderr)
	if err != nil {
		return err
	}
	log := webhookLogger(f, stderr)
	logf.SetLogger(log)
	klog.SetLogger(log)
	if f.opts.Config, err = config.Load(f.configFile); err != nil {
		return err
	}
	if f.opts.RESTConfig, err = restConfig(f.kubeconfig, ""); err != nil {
		return err
	}
	f.opts.Log = log
	return server.Run(ctx, f.opts)
}

func webhookLogger(f *webhookFlags, w io.Writer) logr.Logger {
	level := zapcore.InfoLevel
	if f.logLevel == "debug" {
		level = zapcore.DebugLevel
	}
	rfc3339 := func(ec *zapcore.EncoderConfig) { ec.EncodeTime = zapcore.RFC3339NanoTimeEncoder }
	enc := zap.JSONEncoder(rfc3339)
	if f.logFormat == "console" {
		enc = zap.ConsoleEncoder(rfc3339)
	}
	return zap.New(zap.WriteTo(w), zap.Level(level), enc, zap.StacktraceLevel(zapcore.PanicLevel))
}
