// Package monitoring holds the tests of the chart's monitoring objects: its
// Grafana dashboard (charts/gpu-injector/files/dashboard.json) and its
// PrometheusRule (charts/gpu-injector/templates/prometheusrule.yaml) may name
// only metrics the code defines or the API server exports, and every alert's
// runbook must be a section of docs/troubleshooting.md. Grafana's own
// dashboard linter is not a Go module the project can build, so its checks
// that matter here are written out. hack/monitoring-test.sh runs these tests
// with promtool's checks of the rules; rules-test.yaml is promtool's input.
package monitoring
