#!/usr/bin/env bash
# The project's test command (make test). Stages: lint, unit, e2e; no
# argument runs all three. Needs only Go (and gcc, apt for the e2e stage).
set -euo pipefail
cd "$(dirname "$0")/.."

stage() { printf '\n==> %s\n' "$*"; }

# cgo (go-nvml) needs a C compiler from the first stage on; a Go-only image
# may lack one.
need_gcc() {
	if ! command -v gcc >/dev/null; then
		stage "gcc (cgo needs it; Debian packages)"
		if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null; then
			echo "gcc is missing: install gcc (sudo apt-get install -y gcc libc6-dev)" >&2; exit 1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null; }
	fi
}

lint() {
	stage "gofmt"
	unformatted=$(gofmt -l $(git ls-files '*.go'))
	if [[ -n "$unformatted" ]]; then
		echo "not gofmt'ed:"; echo "$unformatted"; exit 1
	fi
	stage "go vet (all build tags)"
	go vet ./...
	go vet -tags e2e ./...
	stage "helm lint --strict and chart render tests"
	hack/chart-test.sh
	hack/monitoring-test.sh
}

unit() {
	stage "helm (the chart tests render with it; cached after the first run)"
	hack/tools.sh helm
	stage "unit, golden, handler and fuzz-seed tests"
	go test -count=1 ./...
	# Product code reads time only from a clock (TestProductReadsTimeFromAClock);
	# under the clockskew tag its default clock runs a year ahead, so a test that
	# builds fixed dates but leaves a product path on the real clock fails today,
	# not on the day its dates age out.
	local dated
	dated=$(git grep -l 'time\.Date(' -- '*_test.go' ':!e2e' ':!hack' | xargs -n1 dirname | sort -u | sed 's|^|./|')
	stage "the packages whose tests build fixed dates, with the product's clock a year ahead (clockskew):" ${dated}
	go test -count=1 -tags clockskew ./internal/wallclock/ ${dated}
}

# crio: e2e/cluster's TestNRIRuntime and TestRegistryPull run on CRI-O too, and
# the runtime injection suite's workloads below.
E2E_TOOLS=(all crio)

# prebuild_tools starts building the e2e stage's tools at once, beside lint and
# unit: on a machine that has not built them, they are most of a first run.
prebuild_tools() {
	tools_log="$(mktemp)"
	hack/tools.sh "${E2E_TOOLS[@]}" >"${tools_log}" 2>&1 &
	tools_pid=$!
	trap 'kill "${tools_pid}" 2>/dev/null || true; rm -f "${tools_log}"' EXIT
	stage "cluster binaries, CRI-O among them: building beside lint and unit when not cached (hack/tools.sh ${E2E_TOOLS[*]}, pid ${tools_pid})"
}

e2e() {
	stage "cluster binaries, CRI-O among them (cached after the first run)"
	if [[ -n ${tools_pid:-} ]]; then
		local rc=0
		wait "${tools_pid}" || rc=$?
		cat "${tools_log}"
		[[ ${rc} -eq 0 ]] || { echo "hack/tools.sh ${E2E_TOOLS[*]} failed (exit ${rc})" >&2; exit 1; }
	fi
	hack/tools.sh "${E2E_TOOLS[@]}"
	stage "container runtime (Debian packages, when missing)"
	hack/install-runtime.sh
	stage "Prometheus (Debian package, when missing: the suite checks the chart's alerts and dashboard against it)"
	hack/prometheus-e2e.sh --install
	stage "end-to-end tests on a real kube-apiserver, scheduler, controller-manager and kubelet"
	# hack/image: the release image's docker-archive imported into a real containerd;
	# hack/sign: a signed release built and verified.
	go test -count=1 -tags e2e -timeout 60m -v ./e2e/... ./hack/image/ ./hack/sign/
	stage "the runtime injection suite's workloads on CRI-O (its kubelet node on CRI-O with NRI)"
	E2E_RUNTIME=crio go test -count=1 -tags e2e -timeout 20m -v ./e2e/nri/ \
		-run '^(TestBaselineClassicJob|TestRestrictedCUDAPod|TestBaselineWithoutPlugin)$'
}

need_gcc
case "${1:-all}" in
	lint) lint ;;
	unit) unit ;;
	e2e) e2e ;;
	all) prebuild_tools; lint; unit; e2e ;;
	*) echo "usage: $0 [lint|unit|e2e|all]" >&2; exit 2 ;;
esac
echo; echo "==> ${1:-all}: PASS"
