#!/usr/bin/env bash
# tools/release.sh VERSION  cut a release of the engine's public modules in
# this repository (make release VERSION=v0.1.0), pushing nothing.
#
# It refuses a VERSION that is not vMAJOR.MINOR.PATCH, a tree with changes
# not committed, and a tag that exists already; runs `make api/go`; then
# records the contract, each module's Go API and the commit as released
# (`make api/release`), turns each public module's `## Unreleased` section
# of CHANGELOG.md into `## VERSION (date)`, raises the modules'
# requirements of each other (in every go.mod of the repository) to
# VERSION, commits that, and tags the commit
# once per module with the module's directory (idempotency/pgstore/v0.1.0),
# as the go command expects of a module in a subdirectory.
#
# With DRY_RUN=1 it makes the same checks and prints what it would change
# and tag, and changes nothing. TestRelease (release_test.go) runs both in
# a copy of the checkout. MODULES (space-separated) are the public modules,
# the Makefile's PUBLIC_MODULES.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${1:-}
DRY_RUN=${DRY_RUN:-}
MAKE=${MAKE:-make}
GO=${GO:-go}
read -r -a modules <<<"${MODULES:?MODULES names the public modules (make release sets it)}"
engine=github.com/oncekey/oncekey

fail() { echo "release: $*" >&2; exit 1; }

[[ $VERSION =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] ||
	fail "VERSION must be vMAJOR.MINOR.PATCH, such as v0.1.0 (got \"$VERSION\")"
if [ -n "$(git status --porcelain)" ]; then
	git status --short >&2
	fail "the tree has changes not committed; commit or stash them first"
fi
for m in "${modules[@]}"; do
	! git rev-parse -q --verify "refs/tags/$m/$VERSION" >/dev/null ||
		fail "the tag $m/$VERSION exists already"
	[ -f "$m/CHANGELOG.md" ] || fail "$m has no CHANGELOG.md"
done

"$MAKE" --no-print-directory api/go

today=$(date -u +%Y-%m-%d)
# changelog FILE: FILE with its `## Unreleased` heading made VERSION's, or
# with VERSION's heading and "No changes." added above the first version.
changelog() {
	awk -v version="$VERSION" -v today="$today" '
		!done && /^## Unreleased[[:space:]]*$/ { print "## " version " (" today ")"; done = 1; next }
		!done && /^## / { print "## " version " (" today ")"; print ""; print "- No changes."; print ""; done = 1 }
		{ print }
		END { if (!done) { print ""; print "## " version " (" today ")"; print ""; print "- No changes." } }
	' "$1"
}

# gomods: every go.mod of the repository (the service's, the engine's, the
# examples', the tools'), whose requirements of the engine's modules move
# to VERSION together, or `go mod tidy -diff` would fail in those left
# behind.
gomods() { git ls-files '*go.mod' | xargs -n1 dirname; }

# requires MODULE_DIR: the engine modules MODULE_DIR's go.mod requires.
requires() {
	grep -v '=>' "$1/go.mod" |
		sed -n -E 's#^(require)?[[:space:]]+('"$engine"'/idempotency[^[:space:]]*) v[^[:space:]]+.*$#\2#p' | sort -u
}

if [ -n "$DRY_RUN" ]; then
	echo "release $VERSION (dry run: nothing is changed)"
	echo "would run: $MAKE api/release"
	for m in "${modules[@]}"; do
		echo "would rewrite $m/CHANGELOG.md:"
		diff <(cat "$m/CHANGELOG.md") <(changelog "$m/CHANGELOG.md") | sed 's/^/    /' || true
	done
	for d in $(gomods); do
		for r in $(requires "$d"); do
			grep -q "^[[:space:]]*$r $VERSION\b" "$d/go.mod" || echo "would require $r@$VERSION in $d/go.mod"
		done
	done
	echo "would commit: release $VERSION"
	for m in "${modules[@]}"; do echo "would tag $m/$VERSION"; done
	exit 0
fi

"$MAKE" --no-print-directory api/release
for m in "${modules[@]}"; do
	changelog "$m/CHANGELOG.md" >"$m/CHANGELOG.md.new"
	mv "$m/CHANGELOG.md.new" "$m/CHANGELOG.md"
done
for d in $(gomods); do
	for r in $(requires "$d"); do (cd "$d" && "$GO" mod edit -require="$r@$VERSION"); done
done
git add -A
git commit -q -m "release $VERSION: ${modules[*]}"
for m in "${modules[@]}"; do
	git tag -a -m "$engine/$m $VERSION" "$m/$VERSION"
	echo "tagged $m/$VERSION"
done
echo "release $VERSION made at $(git rev-parse --short HEAD); nothing is pushed: git push origin HEAD && git push origin --tags"
