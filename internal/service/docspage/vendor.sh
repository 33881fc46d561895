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
# Redoc always renders its "API docs by Redocly" logo from cdn.redoc.ly, and
# no option turns it off; the page must load nothing from elsewhere, so the
# URL becomes an empty inline SVG.
sed -i 's|https://cdn.redoc.ly/redoc/logo-mini.svg|data:image/svg+xml,%3Csvg xmlns=%22http://www.w3.org/2000/svg%22 width=%221%22 height=%221%22/%3E|' assets/redoc.standalone.js
if grep -q 'cdn\.redoc\.ly' assets/redoc.standalone.js; then
	echo "vendor.sh: the bundle still references cdn.redoc.ly" >&2
	exit 1
fi
echo "vendored redoc@${REDOC_VERSION} standalone bundle"
