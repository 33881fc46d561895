#!/usr/bin/env bash
# tools/fuzz.sh TIME TARGET:DIR...  run each fuzz target in its package's
# directory for TIME (make fuzz does, with FUZZ_TARGETS).
#
# Go 1.26's fuzzing coordinator can end a run that found nothing with
# "context deadline exceeded" at the -fuzztime boundary, when a worker is
# slow to stop on a busy machine (go.dev/issue/75804, fixed in Go 1.27). A
# run that fails that way and writes no failing input is run once more; any
# other failure, or that one twice, fails.
set -euo pipefail
time=$1
shift
for target in "$@"; do
	name=${target%%:*}
	dir=${target#*:}
	corpus=$dir/testdata/fuzz/$name
	echo "== $name"
	for attempt in 1 2; do
		before=$(ls "$corpus" 2>/dev/null | wc -l || true)
		log=$(mktemp)
		if (cd "$dir" && ${GO:-go} test -run='^$' -fuzz="^$name\$" -fuzztime="$time" -fuzzminimizetime="$time" .) 2>&1 | tee "$log"; then
			rm -f "$log"
			break
		fi
		after=$(ls "$corpus" 2>/dev/null | wc -l || true)
		if [ "$attempt" = 1 ] && [ "$before" = "$after" ] && grep -qx '    context deadline exceeded' "$log"; then
			echo "fuzz: $name stopped on Go's -fuzztime deadline race (go.dev/issue/75804) and wrote no failing input: once more"
			rm -f "$log"
			continue
		fi
		rm -f "$log"
		exit 1
	done
done
