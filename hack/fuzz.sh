#!/usr/bin/env bash
# Runs every fuzz target (parsers of untrusted input) for FUZZTIME each.
# Their seed corpora also run in plain `go test`, so CI always covers them.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-30s}
for target in "FuzzDecode ./layout" "FuzzAdmissionReview ./webhook" "FuzzParse ./nodeprobe/ldcache"; do
	set -- $target
	echo "==> $1 ($2) for $t"
	go test -run '^$' -fuzz "^$1\$" -fuzztime "$t" "$2"
done
