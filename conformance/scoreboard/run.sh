#!/usr/bin/env bash
# run.sh points `oncekey conformance` at Idempotency-Key implementations
# nobody here wrote (apps/*, one per library) under each profile, keeps the
# JSON reports in RESULTS (default conformance/scoreboard/results/), and
# writes SCOREBOARD.md from them. See docs/conformance.md, "Scoreboard".
#
#   conformance/scoreboard/run.sh            # or: make scoreboard
#   PROFILES="myprofile" conformance/scoreboard/run.sh   # adds profiles
#
# It exits 0 when every run completed, whatever the libraries' results (a
# failed check is a finding about them); non-zero when it could not run
# something: npm ci, the build, an app that did not start or answer, a run
# of the tool that wrote no report (a setup error).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
results=${RESULTS:-$here/results}
# The profiles every run has, then any others PROFILES names.
profiles=(oncekey ietf ietf-07 stripe agent-commerce)
for p in ${PROFILES:-}; do
	[[ " ${profiles[*]} " == *" $p "* ]] || profiles+=("$p")
done

# APPS: name, folder under apps/, and the environment it starts with.
# Each app listens on 127.0.0.1 at PORT (0: a free port, which it prints).
apps=(
	"express-idempotency|express-idempotency|NODE_ENV=production"
	"node-idempotency-nestjs|node-idempotency-nestjs|NODE_ENV=production"
	"node-idempotency-fastify|node-idempotency-fastify|NODE_ENV=production"
	"powertools-redis|powertools-redis|POWERTOOLS_VALIDATE=1"
	"powertools-redis-novalidation|powertools-redis|POWERTOOLS_VALIDATE=0"
)

say() { echo "scoreboard: $*" >&2; }

for tool in node npm jq curl "${GO:-go}"; do
	command -v "$tool" >/dev/null 2>&1 || { say "$tool is required (Node.js 20+ and npm, jq, curl, Go)"; exit 1; }
done

# npm ci when node_modules is missing or older than the lock file.
if [[ ! -f $here/node_modules/.package-lock.json || $here/package-lock.json -nt $here/node_modules/.package-lock.json ]]; then
	say "npm ci"
	(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi

# bin/oncekey when missing or older than the tool's sources.
bin=$root/bin/oncekey
if [[ ! -x $bin ]] || [[ -n $(find "$root/internal/conformance" "$root/cmd/oncekey" -name '*.go' -newer "$bin" -print -quit) ]]; then
	say "building bin/oncekey"
	(cd "$root" && "${GO:-go}" build -o bin/oncekey ./cmd/oncekey)
fi

mkdir -p "$results"
# The last run's reports go (summary.json stays until a run replaces it).
rm -f "$results"/*.*.json "$results"/*.log

app_pid=
cleanup() {
	if [[ -n $app_pid ]] && kill -0 "$app_pid" 2>/dev/null; then
		kill -TERM "$app_pid" 2>/dev/null || true
		# The app ends on SIGTERM (the Redis one deletes its keys first);
		# one that has not after 10 s is killed.
		for _ in $(seq 100); do kill -0 "$app_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$app_pid" 2>/dev/null || true
		wait "$app_pid" 2>/dev/null || true
	fi
	app_pid=
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_app NAME DIR ENV: starts it on a free port, sets url once it
# answers (any HTTP status) within 30 s, else fails.
start_app() {
	local name=$1 dir=$2 env=$3 log=$results/$1.app.log
	# The Redis apps keep their records under a prefix of this run's own.
	# One simple command, so that $! is node's own pid (env execs it).
	# shellcheck disable=SC2086 # $env is words, VAR=value each
	env -C "$here/apps/$dir" PORT=0 REDIS_PREFIX="oncekey-scoreboard-$$-$name" $env node app.js >"$log" 2>&1 &
	app_pid=$!
	url=
	local deadline=$((SECONDS + 30))
	while ((SECONDS < deadline)); do
		kill -0 "$app_pid" 2>/dev/null || { say "$name exited before it listened:"; cat "$log" >&2; return 1; }
		if [[ -z $url ]]; then
			url=$(sed -n 's/^listening \(http:\/\/127\.0\.0\.1:[0-9]*\)$/\1/p' "$log" | head -1)
		fi
		if [[ -n $url ]] && curl -s -o /dev/null --max-time 2 "$url/orders/none"; then
			return 0
		fi
		sleep 0.1
	done
	say "$name did not answer within 30 s:"
	cat "$log" >&2
	return 1
}

for entry in "${apps[@]}"; do
	IFS='|' read -r name dir env <<<"$entry"
	start_app "$name" "$dir" "$env"
	for profile in "${profiles[@]}"; do
		say "$name under $profile ($url)"
		out=$results/$name.$profile.json
		rc=0
		# retention retries a key 1 s after its first request: the apps keep
		# theirs 10 min or for their life, so only a key lost at once fails.
		"$bin" conformance --spec "$here/apps/$dir/openapi.yaml" --url "$url" --overrides "$here/overrides.yaml" \
			--profile "$profile" --retention-wait 1s --format json >"$out" 2>"$results/$name.$profile.log" || rc=$?
		# 0, 1 and 2 with a report are the API's results; anything else, or
		# no report, is the tool's setup refusing to run.
		if ((rc > 2)) || ! jq -se 'length == 1 and (.[0].results | type == "array")' "$out" >/dev/null 2>&1; then
			say "$name under $profile: the tool exited $rc without a report:"
			cat "$results/$name.$profile.log" >&2
			exit 1
		fi
	done
	cleanup
done

names=()
for entry in "${apps[@]}"; do names+=("${entry%%|*}"); done
(cd "$root" && "${GO:-go}" run ./conformance/scoreboard -results "$results" \
	-apps "${names[*]}" -profiles "${profiles[*]}" -out "$here/SCOREBOARD.md")
say "wrote $here/SCOREBOARD.md"
