#!/usr/bin/env bash
# Fuzzes every target (the parsers of untrusted input), one after the other,
# and prints per target: executions, rate and new corpus entries.
#
#   hack/fuzz.sh                      every target for FUZZTIME (default 30s)
#   FUZZTIME=10000000x hack/fuzz.sh   every target for 10 M executions
#   hack/fuzz.sh FuzzParse FuzzDecode only these targets
#   hack/fuzz.sh --build DIR          build one instrumented test binary per
#                                     package into DIR, to fuzz on a machine
#                                     without Go (FUZZBIN=DIR there)
#
# Environment:
#   FUZZTIME          a duration (90s, 10m) or a count of executions (10000000x)
#   FUZZPARALLEL      fuzzing workers (default: every core); 1 on a shared machine
#   FUZZMINIMIZETIME  how long to minimize each new input: a time (1s) or a
#                     count of executions (default 250x). Go's default of 60s
#                     spends most of a run minimizing, not fuzzing
#   FUZZKEEP          copy the inputs this run added to Go's fuzz cache into
#                     the target's testdata/fuzz/ (smallest first, up to this
#                     many bytes per target), so that plain `go test` replays them
#   FUZZINSTRUMENT    module (default): coverage counters in this module's
#                     packages only (hack/fuzz/instrument-module.sh): up to
#                     25 times the executions per second of the targets that
#                     link the Kubernetes libraries (docs/reliability.md);
#                     all: every package, as go test -fuzz does by itself
#   FUZZBIN           run the test binaries --build wrote into this folder
#                     instead of `go test` (from a copy of this repository)
#   TMPDIR            where targets write their files (default /dev/shm when
#                     present: the targets that write host files per input
#                     run 1.7 to 5.7 times faster on tmpfs than on a disk)
#
# Seed corpora and testdata/fuzz/ run in plain `go test`, so CI always
# replays them; this script is for the long runs (figures: docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then
	export TMPDIR=/dev/shm
fi
fuzztime=${FUZZTIME:-30s}
parallel=${FUZZPARALLEL:-$(nproc)}
minimize=${FUZZMINIMIZETIME:-250x}
keep=${FUZZKEEP:-0}
fuzzbin=${FUZZBIN:-}
if [[ -n $fuzzbin ]]; then
	fuzzbin=$(cd "$fuzzbin" && pwd)
	cache="${FUZZCACHE:-$PWD/_output/fuzzcache}"
else
	cache="$(go env GOCACHE)/fuzz/$(go list -m)"
fi
instrument=()
case ${FUZZINSTRUMENT:-module} in
module)
	if [[ -z $fuzzbin || ${1:-} == --build ]]; then
		export FUZZMODULE
		FUZZMODULE=$(go list -m)
		instrument=(-toolexec "$PWD/hack/fuzz/instrument-module.sh")
	fi
	;;
all) ;;
*)
	echo "FUZZINSTRUMENT is module or all, not ${FUZZINSTRUMENT}" >&2
	exit 2
	;;
esac
binname() { local d=${1#./}; echo "${d//\//_}.test"; }

# Every `func FuzzX(f *testing.F)` of the module, as "FuzzX ./pkg".
mapfile -t all < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' . |
	grep -v '^./bin/' | while read -r file; do
		dir=$(dirname "$file")
		grep -oE '^func Fuzz[A-Za-z0-9_]*' "$file" | sed "s|^func ||; s|\$| $dir|"
	done | sort -u)

if [[ ${1:-} == --build ]]; then
	out=${2:?--build needs a folder}
	mkdir -p "$out"
	for dir in $(printf '%s\n' "${all[@]#* }" | sort -u); do
		echo "==> building $out/$(binname "$dir") (coverage-instrumented, as go test -fuzz builds it)"
		go test -c -fuzz . -trimpath -ldflags '-s -w' "${instrument[@]}" -o "$out/$(binname "$dir")" "$dir"
	done
	exit 0
fi

targets=()
if (($# == 0)); then
	targets=("${all[@]}")
else
	for want in "$@"; do
		found=
		for t in "${all[@]}"; do
			[[ ${t%% *} == "$want" ]] && targets+=("$t") && found=1
		done
		[[ -n $found ]] || { echo "no fuzz target $want; targets: ${all[*]%% *}" >&2; exit 2; }
	done
fi

count_files() { if [[ -d $1 ]]; then find "$1" -type f | wc -l; else echo 0; fi; }

summary=()
failed=0
for t in "${targets[@]}"; do
	name=${t%% *} dir=${t#* }
	pkgcache="$cache/${dir#./}/$name"
	before=$(count_files "$pkgcache")
	log=$(mktemp "${TMPDIR:-/tmp}/fuzz-$name.XXXXXX.log")
	echo "==> $name ($dir): $fuzztime, $parallel worker(s), log $log"
	start=$(date +%s)
	rc=0
	if [[ -n $fuzzbin ]]; then
		# The test binary reads testdata/fuzz from its working folder, as
		# go test runs it; the cache is where go test would keep new inputs.
		(cd "$dir" && "$fuzzbin/$(binname "$dir")" -test.run '^$' -test.fuzz "^$name\$" \
			-test.fuzztime "$fuzztime" -test.fuzzminimizetime "$minimize" -test.parallel "$parallel" \
			-test.fuzzcachedir "$cache/${dir#./}") 2>&1 | tee "$log" || rc=$?
	else
		go test "${instrument[@]}" -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" \
			-parallel "$parallel" "$dir" 2>&1 | tee "$log" || rc=$?
	fi
	secs=$(($(date +%s) - start))
	# The last progress line carries the totals of the fuzzing phase:
	# "fuzz: elapsed: 93s, execs: 1234567 (13274/sec), new interesting: 12 (total: 40)"
	last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -n 1 || true)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	elapsed=$(sed -nE 's/^fuzz: elapsed: ([0-9hms.]+),.*/\1/p' <<<"$last")
	interesting=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
	after=$(count_files "$pkgcache")
	rate=0
	if [[ -n $execs ]]; then
		# elapsed is like 1h2m3s, 93s or 3m0s
		e=$(sed -E 's/h/*3600+/; s/m/*60+/; s/s//; s/\+$//' <<<"$elapsed")
		e=$((${e:-0}))
		((e > 0)) && rate=$((execs / e))
	fi
	status=ok
	if ((rc != 0)) && ! grep -q 'Failing input written to' "$log" &&
		grep -qx '    context deadline exceeded' "$log"; then
		# Go 1.26's coordinator can report the end of a -fuzztime duration
		# as this error, with no failing input (go.dev/issue/75804, fixed
		# in Go 1.27); a count of executions (10000000x) never does.
		status="ok (Go's fuzztime race, no failing input)"
		rc=0
	fi
	((rc == 0)) || { status="FAILED (rc $rc)"; failed=1; }
	if ((keep > 0)) && [[ -d $pkgcache ]]; then
		dest="$dir/testdata/fuzz/$name"
		mkdir -p "$dest"
		used=$(du -sb "$dest" | cut -f1)
		# New since the run started, smallest first, within the byte budget.
		while read -r size file; do
			((used + size <= keep)) || break
			[[ -e $dest/$(basename "$file") ]] && continue
			cp "$file" "$dest/" && used=$((used + size))
		done < <(find "$pkgcache" -type f -newermt "@$start" -printf '%s %p\n' | sort -n)
	fi
	summary+=("$(printf '%-28s %-24s %12s %9s %8s %6s %s' "$name" "$dir" "${execs:-?}" "${rate}/s" "${secs}s" "+$((after - before))" "$status")")
	if ((rc != 0)); then
		echo "$name failed; the failing input is under $dir/testdata/fuzz/$name (see $log)" >&2
	fi
done

echo
printf '%-28s %-24s %12s %9s %8s %6s %s\n' target package executions rate wall corpus result
printf '%s\n' "${summary[@]}"
exit $failed
