#!/usr/bin/env bash
# gpu-smoke.sh: proof on a real GPU that a container whose image holds no file
# of the NVIDIA driver runs nvidia-smi and a CUDA kernel with only what
# gpu-injector injects, and fails without it (docs/real-gpu.md).
#
#   hack/gpu-smoke.sh --build   here, with Go: build .device/bin/gpu-injector (cgo,
#                               for NVML) and .device/bin/podsim (static)
#   hack/gpu-smoke.sh           on a GPU machine (root, nvcc, no Go), from the
#                               repository root, with .device/ copied there
#   hack/gpu-smoke.sh --fake    the same run on this machine, against the project's
#                               stand-in driver (e2e/standin) in a fake node folder:
#                               needs Go, gcc and root; proves the plumbing, not a GPU
#
# The run: (1) build hack/gpu/cuda-smoke.cu with `nvcc -cudart static`; (2) build a
# driverless root from the host's glibc (hack/gpu/make-driverless-root.sh, which
# fails if any path in it names nvidia or libcuda); (3) `gpu-injector nodeprobe
# --once --host-root /` and turn its Node into a schedulable one (Ready, GPUs
# allocatable: what the kubelet and the device plugin would report); (4)
# `gpu-injector mutate` the classic nvidia-smi Job (legacy resource name) and a
# CUDA Pod against it; (5) run both with hack/podsim on the driverless root:
# nvidia-smi must list the GPU, the kernel must compute the right result; (6) the
# negative control: the same manifests unmutated, same root, must fail; (7) a
# PASS/FAIL table. Exit status 0 only when every check passed.
#
# Environment: BIN (binaries, default ./.device/bin), OUT (results, default
# ./gpu-smoke-out), NVCC (default: found in PATH or /usr/local/cuda*/bin),
# NVCC_ARCH (default sm_90: H100 and H200), EXPECT_GPU (default H100).
#
# Results in $OUT: gpu-smoke.log (every command and its output, by section),
# summary.txt, probe-node.yaml (what the probe printed), node.yaml (the Node the
# mutation saw), mutated.yaml (both mutated manifests).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
repo=$(pwd)

mode=real
case "${1:-}" in
--build) mode=build ;;
--fake) mode=fake ;;
"") ;;
*)
	sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

if [[ $mode == build ]]; then
	set -e
	mkdir -p .device/bin
	CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o .device/bin/gpu-injector .
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o .device/bin/podsim ./hack/podsim
	ls -la .device/bin
	echo "built; copy .device to the GPU machine's copy of this repository and run there: bash hack/gpu-smoke.sh"
	exit 0
fi

BIN=${BIN:-./.device/bin}
OUT=${OUT:-./gpu-smoke-out}
EXPECT_GPU=${EXPECT_GPU:-H100}
NVCC_ARCH=${NVCC_ARCH:-sm_90}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$BIN" 2>/dev/null && pwd) || BIN=$repo/.device/bin
LOG=$OUT/gpu-smoke.log
: >"$LOG"
work=$(mktemp -d /tmp/gpu-smoke.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

names=()
results=()
details=()
# record NAME PASS|FAIL DETAIL: one row of the summary table.
record() {
	names+=("$1")
	results+=("$2")
	details+=("$3")
	printf '\n>>> %s: %s (%s)\n' "$2" "$1" "$3" | tee -a "$LOG"
}
section() {
	printf '\n===== %s =====\n' "$1" | tee -a "$LOG"
}
# run OUTFILE CMD...: run a command, its stdout and stderr together into OUTFILE,
# the log and the terminal; returns its exit status.
run() {
	local outfile=$1 rc
	shift
	printf '$ %s\n' "$*" | tee -a "$LOG"
	"$@" >"$outfile" 2>&1
	rc=$?
	tee -a "$LOG" <"$outfile"
	printf '[exit status %d]\n' "$rc" | tee -a "$LOG"
	return "$rc"
}

gi=$BIN/gpu-injector
podsim=$BIN/podsim
root=$work/root
mkdir -p "$work/bin"

section "machine"
{
	echo "mode: $mode"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "kernel: $(uname -srm)"
	grep PRETTY_NAME /etc/os-release 2>/dev/null
	echo "glibc: $(ldd --version 2>/dev/null | head -1)"
	echo "git: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	ls -la "$BIN" 2>&1
	ls -la /dev/nvidia* 2>&1
} 2>&1 | tee -a "$LOG"
for b in "$gi" "$podsim"; do
	if [[ ! -x $b ]]; then
		record "binary $(basename "$b")" FAIL "$b missing: run hack/gpu-smoke.sh --build on a machine with Go and copy .device here"
	fi
done

# ---------------------------------------------------------------------------
section "1. the CUDA program"
prog=$work/bin/cuda-smoke
if [[ $mode == fake ]]; then
	# The stand-in driver runs no kernels: its test program is e2e/workloads'
	# cuda-check, which loads libcuda.so.1 by SONAME as the CUDA runtime does.
	expect_cuda_ok='loaded libcuda\.so\.1 from /usr/local/nvidia/lib64/'
	expect_cuda_fail='cannot load libcuda\.so\.1'
	expect_gpu='Stand-in GPU'
	if run "$work/build.out" gcc -O2 -o "$prog" e2e/workloads/csrc/cuda-check.c -ldl; then
		record "build the CUDA program" PASS "gcc e2e/workloads/csrc/cuda-check.c (stand-in mode)"
	else
		record "build the CUDA program" FAIL "gcc failed"
	fi
else
	expect_cuda_ok='CUDA kernel result: OK'
	expect_cuda_fail='CUDA error|insufficient|cannot open shared object'
	expect_gpu=$EXPECT_GPU
	nvcc=${NVCC:-$(command -v nvcc)}
	if [[ -z $nvcc ]]; then
		for c in /usr/local/cuda*/bin/nvcc /usr/local/cuda/bin/nvcc; do
			[[ -x $c ]] && nvcc=$c
		done
	fi
	if [[ -z $nvcc ]]; then
		record "build the CUDA program" FAIL "no nvcc in PATH or /usr/local/cuda*/bin"
	else
		run "$work/nvcc-version.out" "$nvcc" --version
		if run "$work/build.out" "$nvcc" -O2 -cudart static -arch="$NVCC_ARCH" -o "$prog" hack/gpu/cuda-smoke.cu; then
			record "build the CUDA program" PASS "$nvcc -cudart static -arch=$NVCC_ARCH"
		else
			record "build the CUDA program" FAIL "nvcc failed"
		fi
	fi
fi
if [[ -x $prog ]]; then
	run "$work/ldd.out" ldd "$prog"
fi

# ---------------------------------------------------------------------------
section "2. the driverless root"
if [[ $mode == fake ]]; then
	host_root=$work/node
	if run "$work/standin.out" go run ./hack/gpu/standin-node --root "$host_root" --layout usr-local-nvidia --version 580.159.04; then
		record "fake node with the stand-in driver" PASS "$host_root"
	else
		record "fake node with the stand-in driver" FAIL "go run ./hack/gpu/standin-node failed"
	fi
else
	host_root=/
fi
smi_host=$host_root/usr/local/nvidia/bin/nvidia-smi
libs_for=()
if [[ -x $smi_host ]]; then
	# nvidia-smi arrives by mount but still needs the image's libc.
	libs_for=(--libs-for "$smi_host")
fi
if [[ -x $prog ]] && run "$work/root.out" bash hack/gpu/make-driverless-root.sh "${libs_for[@]}" "$root" "$prog"; then
	record "driverless root, no NVIDIA file" PASS "$(cd "$root" && find . -type f | wc -l) files, none matching nvidia|libcuda"
	(cd "$root" && find . | sort) >>"$LOG"
else
	record "driverless root, no NVIDIA file" FAIL "make-driverless-root.sh failed"
fi

# ---------------------------------------------------------------------------
section "3. probe the node"
# The Node goes to stdout, the probe's logs to stderr.
printf '$ %s\n' "$gi nodeprobe --once --host-root $host_root -o yaml" | tee -a "$LOG"
"$gi" nodeprobe --once --host-root "$host_root" -o yaml >"$work/probe-node.yaml" 2>"$work/probe.log"
probe_rc=$?
tee -a "$LOG" <"$work/probe.log"
tee -a "$LOG" <"$work/probe-node.yaml"
printf '[exit status %d]\n' "$probe_rc" | tee -a "$LOG"
cp "$work/probe-node.yaml" "$OUT/probe-node.yaml" 2>/dev/null
if [[ $probe_rc -eq 0 ]] && grep -q 'gpu-injector.io/state: ready' "$work/probe-node.yaml"; then
	record "nodeprobe --once finds a ready layout" PASS "driver $(awk '/gpu-injector.io\/driver-version:/ {print $2}' "$work/probe-node.yaml"), fingerprint $(awk '/gpu-injector.io\/layout-fingerprint:/ {print $2}' "$work/probe-node.yaml")"
else
	record "nodeprobe --once finds a ready layout" FAIL "exit status $probe_rc"
fi
# What the kubelet (Ready) and the device plugin (allocatable GPUs) report on a
# real node; the probe publishes only labels and annotations.
gpus=$(awk -F': ' '/gpu-injector.io\/gpu-count:/ {gsub(/"/, "", $2); print $2}' "$work/probe-node.yaml")
{
	cat "$work/probe-node.yaml"
	printf 'status:\n  allocatable:\n    nvidia.com/gpu: "%s"\n  capacity:\n    nvidia.com/gpu: "%s"\n  conditions:\n  - type: Ready\n    status: "True"\n' "${gpus:-1}" "${gpus:-1}"
} >"$work/node.yaml"
cp "$work/node.yaml" "$OUT/node.yaml"
printf '$ cat node.yaml\n' >>"$LOG"
cat "$work/node.yaml" >>"$LOG"

# ---------------------------------------------------------------------------
section "4. mutate the manifests"
: >"$OUT/mutated.yaml"
for m in nvidia-smi-job cuda-pod; do
	printf '$ %s\n' "$gi mutate -f hack/gpu/$m.yaml --nodes node.yaml" | tee -a "$LOG"
	"$gi" mutate -f "hack/gpu/$m.yaml" --nodes "$work/node.yaml" >"$work/$m.mutated.yaml" 2>"$work/$m.mutate.err"
	rc=$?
	tee -a "$LOG" <"$work/$m.mutate.err"
	printf '[exit status %d]\n' "$rc" | tee -a "$LOG"
	diff -u "hack/gpu/$m.yaml" "$work/$m.mutated.yaml" | tee -a "$LOG"
	{
		echo "# gpu-injector mutate -f hack/gpu/$m.yaml --nodes node.yaml"
		cat "$work/$m.mutated.yaml"
		echo "---"
	} >>"$OUT/mutated.yaml"
	if [[ $rc -eq 0 ]] && grep -q 'gpu-injector.io/injected' "$work/$m.mutated.yaml"; then
		record "mutate $m" PASS "$(grep -c 'readOnly: true' "$work/$m.mutated.yaml") read-only mounts injected"
	else
		record "mutate $m" FAIL "exit status $rc, or no gpu-injector.io/injected annotation"
	fi
done

# ---------------------------------------------------------------------------
# podsim_check NAME WANT(ok|fail) PATTERN MANIFEST [PODSIM ARGS...]
podsim_check() {
	local name=$1 want=$2 pattern=$3 manifest=$4 rc
	shift 4
	run "$work/podsim.out" "$podsim" -f "$manifest" --root "$root" --host-root "$host_root" "$@"
	rc=$?
	if [[ $want == ok ]]; then
		if [[ $rc -eq 0 ]] && grep -Eq "$pattern" "$work/podsim.out"; then
			record "$name" PASS "exit 0, output matches '$pattern'"
		else
			record "$name" FAIL "exit $rc; want 0 and output matching '$pattern'"
		fi
	else
		if [[ $rc -ne 0 ]] && grep -Eq "$pattern" "$work/podsim.out"; then
			record "$name" PASS "exit $rc, output matches '$pattern'"
		else
			record "$name" FAIL "exit $rc; want non-zero and output matching '$pattern'"
		fi
	fi
}

section "5. the mutated containers on the driverless root"
node_args=(--node "$work/node.yaml")
podsim_check "mutated Job: nvidia-smi -L lists the GPU" ok "GPU 0: .*$expect_gpu" "$work/nvidia-smi-job.mutated.yaml" "${node_args[@]}" -- /usr/local/nvidia/bin/nvidia-smi -L
podsim_check "mutated Job: nvidia-smi" ok "$expect_gpu" "$work/nvidia-smi-job.mutated.yaml" "${node_args[@]}"
podsim_check "mutated Pod: CUDA program" ok "$expect_cuda_ok" "$work/cuda-pod.mutated.yaml" "${node_args[@]}"

section "6. negative control: the same manifests, not mutated, on the same root"
podsim_check "unmutated Job: nvidia-smi is missing" fail 'not found' hack/gpu/nvidia-smi-job.yaml
podsim_check "unmutated Pod: CUDA program has no driver" fail "$expect_cuda_fail" hack/gpu/cuda-pod.yaml

section "7. the root is still driverless"
if [[ -d $root ]] && ! (cd "$root" && find . | grep -Ei 'nvidia|libcuda' | tee -a "$LOG" | grep -q .); then
	record "root unchanged by the runs" PASS "no path matches nvidia|libcuda after the runs"
else
	record "root unchanged by the runs" FAIL "NVIDIA files in the root after the runs (or no root)"
fi

# ---------------------------------------------------------------------------
section "summary"
failed=0
{
	printf '%-4s  %-52s  %s\n' "" "check" "detail"
	for i in "${!names[@]}"; do
		printf '%-4s  %-52s  %s\n' "${results[$i]}" "${names[$i]}" "${details[$i]}"
		[[ ${results[$i]} == PASS ]] || failed=$((failed + 1))
	done
	if [[ $failed -eq 0 ]]; then
		echo "gpu-smoke ($mode): PASS, ${#names[@]} checks"
	else
		echo "gpu-smoke ($mode): FAIL, $failed of ${#names[@]} checks failed"
	fi
} | tee "$OUT/summary.txt" | tee -a "$LOG"
grep -q ': PASS,' "$OUT/summary.txt"
