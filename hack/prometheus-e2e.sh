#!/usr/bin/env bash
# Runs the chart's alerts and Grafana dashboard against a real Prometheus scraping a real
# cluster: installs Debian's prometheus package when it is missing (apt-get, as root),
# then runs the e2e suite's TestStatusPrometheus, which brings up the local cluster
# (about 5 minutes). The e2e suite runs that test by itself whenever prometheus is on
# PATH or $PROMETHEUS names it; this script is for a machine without it.
#
#   hack/prometheus-e2e.sh             install when missing, then run the test
#   hack/prometheus-e2e.sh --install   only install (make test's e2e stage, so that the
#                                      suite runs the test rather than skipping it)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${PROMETHEUS:-}" ]] && ! command -v prometheus >/dev/null; then
  if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "prometheus is missing: install it (sudo apt-get install prometheus) or set PROMETHEUS" >&2
    exit 1
  fi
  echo "[prometheus-e2e] installing Debian's prometheus (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
fi
[[ ${1:-} == --install ]] && exit 0
exec go test -tags e2e -count=1 -timeout 20m -v -run 'TestStatusPrometheus' ./e2e/
