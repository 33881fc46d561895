#!/usr/bin/env bash
# tools/preflight.sh  the programs make test needs besides Go, each missing
# one named in one line with the Debian package that brings it (make
# test/preflight runs this first).
#
# Some are needed by the Go tests of every step (the README's curl lines,
# the Python upstream the gateway's tests stand in front of, the Redis
# Cluster tests' own redis-server processes): without them make test
# cannot tell anything, so a missing one fails here, everywhere. The
# others are needed by one step each (npm by test/sdk, promtool by
# test/alerts, a container engine by test/image): with CI set a missing
# one fails here, since a suite that skips in CI proves nothing; elsewhere
# it is a warning, and make test goes on and skips that step, saying so.
set -uo pipefail

missing=0
skipped=0

# need TOOL PACKAGE WHAT: TOOL must be on PATH for every step.
need() {
	command -v "$1" >/dev/null 2>&1 && return
	echo "preflight: $1 is missing, and $3 needs it: apt-get install $2"
	missing=$((missing + 1))
}

# has TOOL: TOOL is on PATH; for podman, a container engine that works
# (deploy/container/engine.sh: podman, or a Docker daemon that answers).
has() {
	if [ "$1" = podman ]; then
		"$(dirname "$0")/../deploy/container/engine.sh" --which >/dev/null 2>&1
		return
	fi
	command -v "$1" >/dev/null 2>&1
}

# step_needs STEP TOOL PACKAGE: STEP alone needs TOOL.
step_needs() {
	has "$2" && return
	if [ -n "${CI:-}" ]; then
		echo "preflight: $2 is missing, and make $1 needs it (required when CI is set): apt-get install $3"
		missing=$((missing + 1))
	else
		echo "preflight: $2 is missing: make test skips $1 (apt-get install $3)"
		skipped=$((skipped + 1))
	fi
}

need curl curl "the README examples' tests (cmd/oncekey)"
need python3 python3 "the gateway's tests (their upstream, internal/gateway/upstreamtest)"
need redis-server redis-server "the Redis Cluster tests (idempotency/redisstore/redistest)"
need redis-cli redis-tools "the Redis Cluster tests (idempotency/redisstore/redistest)"
step_needs test/sdk npm "nodejs npm"
step_needs test/alerts promtool prometheus
step_needs test/image podman "podman runc"

if [ "$missing" -gt 0 ]; then
	echo "preflight: $missing program(s) missing; install them and run make test again"
	exit 1
fi
[ "$skipped" = 0 ] || echo "preflight: going on without $skipped step(s); set CI to make a missing program fail the run"
exit 0
