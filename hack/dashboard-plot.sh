#!/usr/bin/env bash
# Draws the panels of the chart's Grafana dashboard as their data plotted from a real
# Prometheus, into one PNG: Grafana itself is not run (it is not packaged by Debian and
# not buildable from Go modules here), so the same queries are asked of Prometheus and
# drawn with gnuplot.
#
#   hack/dashboard-plot.sh [DATA_DIR] [OUT_PNG]
#
# DATA_DIR (default: a new temporary folder) holds one JSON file per panel. When it holds
# none, the e2e suite's TestStatusPrometheus runs with GPU_INJECTOR_DASHBOARD_DATA=DATA_DIR:
# it brings up the local cluster, a real Prometheus scraping it (Debian's package, which
# hack/prometheus-e2e.sh installs when missing), keeps admissions going for three to eight
# minutes (until a probe has run) and writes every panel's range queries there (10 to 15
# minutes in all). Then
# hack/dashboard-plot/ writes a gnuplot script and its data files, and gnuplot (Debian's
# gnuplot-nox, installed with apt-get when missing) draws OUT_PNG
# (default docs/day-two-dashboard.png).
set -euo pipefail
cd "$(dirname "$0")/.."

data=${1:-}
out=${2:-docs/day-two-dashboard.png}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -z $data ]]; then
  data=$work/data
fi

if ! command -v gnuplot >/dev/null; then
  if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "gnuplot is missing: install it (sudo apt-get install gnuplot-nox)" >&2
    exit 1
  fi
  echo "[dashboard-plot] installing Debian's gnuplot-nox (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; }
fi

if compgen -G "$data/panel-*.json" >/dev/null; then
  echo "[dashboard-plot] using the panels' data already in $data" >&2
else
  hack/prometheus-e2e.sh --install
  echo "[dashboard-plot] running TestStatusPrometheus to write the panels' data into $data (10 to 15 minutes)" >&2
  mkdir -p "$data"
  data=$(cd "$data" && pwd)
  GPU_INJECTOR_DASHBOARD_DATA=$data go test -tags e2e -count=1 -timeout 20m -v -run 'TestStatusPrometheus' ./e2e/ >"$work/e2e.log" 2>&1 ||
    { tail -50 "$work/e2e.log" >&2; echo "[dashboard-plot] TestStatusPrometheus failed (the last lines above)" >&2; exit 1; }
  compgen -G "$data/panel-*.json" >/dev/null || { echo "[dashboard-plot] the test wrote no panel data into $data" >&2; exit 1; }
fi

echo "[dashboard-plot] writing the gnuplot script and data files" >&2
go run ./hack/dashboard-plot -data "$data" -work "$work/plot" -out "$out"
echo "[dashboard-plot] drawing $out with gnuplot" >&2
gnuplot "$work/plot/dashboard.gp"
echo "[dashboard-plot] wrote $out ($(( $(stat -c %s "$out") / 1024 )) KiB)" >&2
