#!/usr/bin/env bash
# make demo: a local Kubernetes cluster with simulated GPU nodes (stand-in
# drivers, no GPU), gpu-injector installed, the classic GPU workloads applied,
# and a report of what was injected into each pod. docs/demo.md says more.
#
#   hack/demo.sh [--exit] [--keep-on-failure] [--timeout 3m] [--wait-for-other 0]
#
# Stays up until Ctrl-C or SIGTERM, then tears everything down; --exit tears
# down right after the report (tests, CI). Needs root, Go, gcc and apt.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[demo] %s\n' "$*" >&2; }

CACHE="${GPU_INJECTOR_CACHE:-bin}"
if [[ ! -f "${CACHE}/kubernetes-v1.36.3/.complete" || ! -f "${CACHE}/etcd-v3.5.21/.complete" ]]; then
	log "first run: building etcd, Kubernetes v1.36.3 and helm from source into ${CACHE}/"
	log "(15-40 minutes on 2 cores, most of it kube-apiserver; docs/local-cluster.md has the measurements; cached under bin/ after that)"
fi
hack/tools.sh all
hack/install-runtime.sh

# Built, then exec'ed rather than `go run`: a SIGTERM must reach the demo
# itself (go run would leave it orphaned), so that it tears everything down.
log "building the demo program (go build ./hack/demo)"
mkdir -p "${CACHE}"
go build -o "${CACHE}/gpu-injector-demo" ./hack/demo
exec "${CACHE}/gpu-injector-demo" "$@"
