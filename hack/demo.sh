#!/usr/bin/env bash
# make demo: a local Kubernetes cluster with simulated GPU nodes (stand-in
# drivers, no GPU), gpu-injector installed, the classic GPU workloads applied,
# and a report of what was injected into each pod. docs/demo.md says more.
#
#   hack/demo.sh [--exit] [--keep-on-failure] [--timeout 3m]
#
# Stays up until Ctrl-C or SIGTERM, then tears everything down; --exit tears
# down right after the report (tests, CI). Needs root, Go, gcc and apt.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[demo] %s\n' "$*" >&2; }

# shellcheck source=versions.sh
source hack/versions.sh
CACHE="${GPU_INJECTOR_CACHE_DIR}"
if [[ ! -f "${CACHE}/kubernetes-${KUBERNETES_VERSION}/.complete" || ! -f "${CACHE}/etcd-${ETCD_VERSION}/.complete" ]]; then
	log "first run: building etcd, Kubernetes ${KUBERNETES_VERSION} and helm from source into ${CACHE}/"
	log "(15-40 minutes on 2 cores, most of it kube-apiserver; docs/local-cluster.md has the measurements; cached there for every clone after that)"
fi
hack/tools.sh all
hack/install-runtime.sh

# Built, then exec'ed rather than `go run`: a SIGTERM must reach the demo
# itself (go run would leave it orphaned), so that it tears everything down.
log "building the demo program (go build ./hack/demo)"
mkdir -p bin
go build -o bin/gpu-injector-demo ./hack/demo
exec bin/gpu-injector-demo "$@"
