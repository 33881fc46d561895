#!/usr/bin/env bash
# Vendors Redoc's standalone bundle, pinned below, into assets/ so the /docs
# page needs no CDN at run time. `make docs/assets` runs it; `make verify`
# runs it and fails if the committed file differs (npm pack checks the
# package's integrity against the registry).
set -euo pipefail
REDOC_VERSION=2.5.2
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "redoc@${REDOC_VERSION}" >/dev/null && tar xzf "redoc-${REDOC_VERSION}.tgz" package/bundles/redoc.standalone.js)
cp "$tmp/package/bundles/redoc.standalone.js" assets/redoc.standalone.js
echo "vendored redoc@${REDOC_VERSION} standalone bundle"
