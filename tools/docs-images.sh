#!/usr/bin/env bash
# The pictures in docs/img and what they are made from.
#
#   tools/docs-images.sh render [IMAGE...]  regenerate the images (default: all)
#                                           and record their sources
#   tools/docs-images.sh record [IMAGE...]  record the sources of images that
#                                           are already fresh (make bench does,
#                                           after drawing the chart)
#   tools/docs-images.sh check              fail, naming the image and the
#                                           command, when a source changed
#
# IMAGE is api-docs, dashboard, benchmarks, benchmarks-gateway,
# request-sequence or gateway-key-states. `make docs/images`,
# `make docs/images/check` and the
# per-image targets run this.
#
# A screenshot and a 20-second load run never give the same pixels twice, so
# freshness is judged on the inputs: docs/img/SOURCES.sha256 holds, for each
# image, the SHA-256 of every file it is drawn from, one line per file:
#
#   <image's file in docs/img> <sha256 of the file> <file, relative to the repository>
#
# The image's file is IMAGE.png, or IMAGE.svg for the pictures of the
# mechanism that tools/mechanism draws from their text sources.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
manifest=docs/img/SOURCES.sha256
images=(api-docs dashboard benchmarks benchmarks-gateway request-sequence gateway-key-states)

# file_of IMAGE: IMAGE's file in docs/img.
file_of() {
	case $1 in
	request-sequence | gateway-key-states) echo "$1.svg" ;;
	*) echo "$1.png" ;;
	esac
}

# sources IMAGE: the files IMAGE is drawn from, one a line, sorted.
sources() {
	case $1 in
	api-docs) # what GET /docs serves, and how it is photographed
		printf '%s\n' openapi.yaml internal/service/docspage/assets/index.html \
			internal/service/docspage/assets/redoc.standalone.js tools/node/docs-screenshot.mjs ;;
	dashboard) # the dashboard's panels, and the program that loads and draws them
		printf '%s\n' deploy/grafana/oncekey.json
		find tools/dashboard-snapshot -name '*.go' ! -name '*_test.go' ;;
	benchmarks) # the measured numbers, and the code that draws them
		printf '%s\n' docs/benchmarks.json tools/bench/chart.go tools/bench/report.go ;;
	benchmarks-gateway) # the proxy phase's numbers, and the code that draws them
		printf '%s\n' docs/benchmarks.json tools/bench/chart.go tools/bench/gatewaychart.go tools/bench/report.go ;;
	request-sequence | gateway-key-states) # the picture's text source, and the drawer
		printf '%s\n' "docs/img/src/$1.txt"
		find tools/mechanism -name '*.go' ! -name '*_test.go' ;;
	*) echo "docs-images: unknown image $1 (want one of: ${images[*]})" >&2; return 1 ;;
	esac | LC_ALL=C sort
}

# command IMAGE: what regenerates IMAGE alone.
command_for() {
	case $1 in
	api-docs) echo "make docs/screenshot" ;;
	dashboard) echo "make dashboard-snapshot" ;;
	benchmarks | benchmarks-gateway) echo "make bench/chart" ;;
	request-sequence | gateway-key-states) echo "make docs/mechanism" ;;
	esac
}

# hashes IMAGE: IMAGE's manifest lines as the tree is now.
hashes() {
	local f file
	file=$(file_of "$1")
	sources "$1" | while read -r f; do
		echo "$file $(sha256sum "$f" | cut -d' ' -f1) $f"
	done
}

# record IMAGE...: replace those images' lines in the manifest.
record() {
	local tmp image
	tmp=$(mktemp)
	{
		echo "# The files each image in docs/img is drawn from, with their SHA-256:"
		echo "# <image in docs/img> <sha256> <file>. Written by tools/docs-images.sh (make docs/images);"
		echo "# make docs/images/check (part of make verify) fails when one has changed."
		for image in "${images[@]}"; do
			if [[ " $* " == *" $image "* ]]; then
				hashes "$image"
			elif [ -f "$manifest" ]; then
				recorded "$image"
			fi
		done
	} >"$tmp"
	mv "$tmp" "$manifest"
}

# recorded IMAGE: IMAGE's lines in the manifest.
recorded() {
	[ -f "$manifest" ] || return 0
	awk -v file="$(file_of "$1")" '$1 == file' "$manifest"
}

check() {
	local stale=0 image want got file
	for image in "${images[@]}"; do
		file=$(file_of "$image")
		got=$(hashes "$image")
		want=$(recorded "$image")
		if [ ! -f "docs/img/$file" ]; then
			echo "docs/img/$file is missing; run '$(command_for "$image")' (or 'make docs/images') and commit it"
			stale=1
		elif [ "$got" != "$want" ]; then
			echo "docs/img/$file is stale: $(changed "$want" "$got"); run '$(command_for "$image")' (or 'make docs/images') and commit it with $manifest"
			stale=1
		fi
	done
	if [ "$stale" = 0 ]; then echo "docs/img is fresh: every image's sources match $manifest"; fi
	return "$stale"
}

# changed WANT GOT: which files differ between two sets of manifest lines.
changed() {
	if [ -z "$1" ]; then
		echo "its sources are not recorded in $manifest"
		return
	fi
	diff <(echo "$1" | awk 'NF { print $3, $2 }') <(echo "$2" | awk 'NF { print $3, $2 }') |
		awk '/^</ { was[$2] = 1 } /^>/ { now[$2] = 1 }
			END {
				for (f in now) { out = out sep f (f in was ? " changed" : " is new"); sep = ", " }
				for (f in was) if (!(f in now)) { out = out sep f " is gone"; sep = ", " }
				print out
			}'
}

# free_port: a local TCP port nothing listens on.
free_port() {
	local port
	for _ in $(seq 1 50); do
		port=$((20000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	echo "docs-images: no free port found" >&2
	return 1
}

render_api_docs() {
	local addr log pid
	$GO build -o bin/oncekey ./cmd/oncekey
	addr=127.0.0.1:$(free_port)
	log=$(mktemp)
	ONCEKEY_ADDR=$addr bin/oncekey serve >"$log" 2>&1 &
	pid=$!
	# shellcheck disable=SC2064 # expand now: these locals are gone when the trap runs
	trap "kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f '$log'" EXIT
	for _ in $(seq 1 100); do
		curl -fsS "http://$addr/healthz" >/dev/null 2>&1 && break
		kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "docs-images: oncekey serve exited" >&2; return 1; }
		sleep 0.1
	done
	(
		cd tools/node
		# npm ci takes seconds; skip it when node_modules is newer than the lockfile.
		[ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund --silent
		ONCEKEY_URL="http://$addr" node docs-screenshot.mjs ../../docs/img/api-docs.png
	)
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	rm -f "$log"
	trap - EXIT
}

render() {
	local image
	for image in "$@"; do
		echo "== docs/img/$(file_of "$image")"
		case $image in
		api-docs) render_api_docs ;;
		dashboard) $GO -C tools build -o ../bin/dashboard-snapshot ./dashboard-snapshot && bin/dashboard-snapshot -out docs/img/dashboard.png ;;
		# bench draws both charts from one report.
		benchmarks | benchmarks-gateway) $GO -C tools build -o ../bin/bench ./bench && bin/bench -chart-only -json docs/benchmarks.json -chart docs/img/benchmarks.png ;;
		request-sequence | gateway-key-states) $GO -C tools build -o ../bin/mechanism ./mechanism && bin/mechanism -out docs/img "docs/img/src/$image.txt" ;;
		*) sources "$image" >/dev/null ;;
		esac
		record "$image"
	done
}

cmd=${1:-}
shift || true
[ $# -gt 0 ] || set -- "${images[@]}"
for image in "$@"; do sources "$image" >/dev/null; done
case $cmd in
render) render "$@" ;;
record) record "$@" ;;
check) check ;;
*) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
