#!/usr/bin/env bash
# The benchmarks whose figures docs/benchmarks.md records. COUNT runs of each
# (default 6) so benchstat can give a median and spread on a noisy machine:
#   hack/bench.sh | tee /tmp/bench.txt && go run golang.org/x/perf/cmd/benchstat@latest /tmp/bench.txt
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-6}
echo "==> go $(go version | cut -d' ' -f3), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2
go test -run '^$' -bench 'BenchmarkMutate|BenchmarkHandler|BenchmarkIndexUpdate' -benchmem -count "$count" ./webhook/server/ ./webhook/inject/ ./webhook/gpunodes/
go test -run '^$' -bench 'BenchmarkReadCached' -benchmem -count "$count" ./internal/imageconfig/
go test -run '^$' -bench 'BenchmarkProbe' -benchmem -count "$count" ./nodeprobe/
