#!/usr/bin/env bash
# tools/api-breaking.sh  the contract's breaking-change gate (make
# api/breaking): openapi.yaml against the released contract,
# api/openapi.released.yaml, with oasdiff, then a self-test that the gate
# still tells a breaking change from an additive one.
#
# An enum openapi.yaml marks open (x-open-enum: true: the statuses of
# orders, payments and refunds) may gain values: every client must accept
# one it does not know. oasdiff has no such notion, so the released
# contract is first widened with the new values of the open enums
# (cmd/openenum): oasdiff then sees no addition there, and every removal.
# api/oasdiff-levels.txt makes a removed value of any response enum
# breaking (oasdiff says INFO: a client never sees that value again, but
# one generated from the new contract loses the constant its code named).
# api/breaking-changes.allowed declares what breaks on purpose.
set -euo pipefail
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
oasdiff() { "$GO" tool -modfile=tools/go.mod oasdiff "$@"; }
openenum() { "$GO" run ./cmd/openenum "$@"; }
# gate BASE REVISION [oasdiff flags...]: oasdiff's verdict on REVISION
# against BASE widened by REVISION's open enums.
gate() {
	local base=$1 revision=$2
	shift 2
	openenum widen "$base" "$revision" > "$tmp/base.yaml"
	oasdiff breaking --fail-on ERR --severity-levels api/oasdiff-levels.txt "$tmp/base.yaml" "$revision" --format singleline "$@"
}

gate api/openapi.released.yaml openapi.yaml --err-ignore api/breaking-changes.allowed

# flags REVISION CHECK: the gate, on REVISION against openapi.yaml, must
# report CHECK as an error.
flags() {
	local out
	out=$(gate openapi.yaml "$1" 2>&1) || true # it fails: that is the point
	if ! grep -q "^error at .*\[$2\]" <<<"$out"; then
		echo "api/breaking: the gate did not flag $3 ($2)"
		exit 1
	fi
}
require() {
	grep -q "$1" openapi.yaml || { echo "api/breaking: openapi.yaml has no '$1': update the gate's self-test"; exit 1; }
}
require '^  /orders/{id}:'
require 'enum: \[created, cancelled\]'
require 'enum: \[pending, succeeded, failed\]'
require 'enum: \[card_declined, provider_unavailable, provider_rejected\]'

sed '/^  \/orders\/{id}:/,/^  \/healthz:/{/^  \/healthz:/!d}' openapi.yaml > "$tmp/removed-operation.yaml"
flags "$tmp/removed-operation.yaml" api-path-removed-without-deprecation "a removed operation"

sed 's/enum: \[created, cancelled\]/enum: [created]/' openapi.yaml > "$tmp/removed-value.yaml"
flags "$tmp/removed-value.yaml" response-property-enum-value-removed "a value removed from Order.status"

sed 's/enum: \[card_declined, provider_unavailable, provider_rejected\]/enum: [card_declined, provider_unavailable, provider_rejected, disputed]/' openapi.yaml > "$tmp/closed-added.yaml"
flags "$tmp/closed-added.yaml" response-property-enum-value-added "a value added to Payment.failure_reason, a closed enum"

sed -e 's/enum: \[created, cancelled\]/enum: [created, cancelled, disputed]/' \
	-e 's/enum: \[pending, succeeded, failed\]/enum: [pending, succeeded, failed, disputed]/' openapi.yaml > "$tmp/open-added.yaml"
if ! out=$(gate openapi.yaml "$tmp/open-added.yaml" 2>&1); then
	echo "api/breaking: the gate flagged a value added to the open statuses of orders, payments and refunds:"
	echo "$out"
	exit 1
fi
echo "openapi.yaml is compatible with the released contract; the gate flags a removed operation, a removed status value and a value added to a closed enum, and passes a status value added to an open enum"
