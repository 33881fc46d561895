package caddymodule

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("idempotency", parseCaddyfile)
	// Before reverse_proxy, which it wraps: no `order` line needed.
	httpcaddyfile.RegisterDirectiveOrder("idempotency", httpcaddyfile.Before, "reverse_proxy")
}

// UnmarshalCaddyfile reads the directive:
//
//	idempotency [<matcher>] {
//		scope            <placeholder expression>
//		scope_secret     <secret>       # 32+ bytes, such as {env.IDEMPOTENCY_SCOPE_SECRET}
//		scope_secret_previous <secret>  # repeatable: the secrets it rotated from
//		database_url     <url>
//		namespace        <name>       # required with database_url
//		redis_url        <url>
//		redis_secret     <secret>
//		ttl              <duration>
//		wait             <duration>
//		lease            <duration>
//		max_stored_bytes <n>
//		store_responses  on|off         # off: store no answer at all
//		max_body_bytes   <n>
//		on_unknown       report|retry
//		problem_type_base <uri prefix>
//		operation        <metrics label>
//		profile          ietf|oncekey   # default ietf
//		error_template   <file>         # the upstream's error shape
//		key_header       <name>         # default Idempotency-Key
//		key_body_field   <JSON pointer> # instead of key_header
//	}
//
// profile ietf answers a duplicate in flight (after wait) 409 with
// Retry-After and a key reused with another request 422; oncekey answers
// 202 with Retry-After and 409, for clients generated from a document that
// declares the 202. error_template names a JSON file whose strings may
// hold {type}, {title}, {detail}, {code} and {status}: every answer the
// handler writes itself is that document filled in. key_header or
// key_body_field (such as /idempotency_key) is where clients put the key;
// the upstream receives the request as sent either way. store_responses
// off, for answers that carry personal data, stores none: each passes
// through once, and its key's retries are told it was not stored
// (idempotency.ErrNotStored; never a second run); it goes without
// max_stored_bytes.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	strs := map[string]*string{
		"scope": &h.Scope, "scope_secret": &h.ScopeSecret, "database_url": &h.DatabaseURL, "namespace": &h.Namespace, "redis_url": &h.RedisURL, "redis_secret": &h.RedisSecret,
		"on_unknown": &h.OnUnknown, "problem_type_base": &h.ProblemTypeBase, "operation": &h.Operation,
		"profile": &h.Profile, "error_template": &h.ErrorTemplate, "key_header": &h.KeyHeader, "key_body_field": &h.KeyBodyField,
	}
	durs := map[string]*caddy.Duration{"ttl": &h.TTL, "wait": &h.Wait, "lease": &h.Lease}
	ints := map[string]*int64{"max_stored_bytes": &h.MaxStoredBytes, "max_body_bytes": &h.MaxBodyBytes}
	for d.NextBlock(0) {
		name := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		value := d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
		var err error
		if name == "scope_secret_previous" {
			h.ScopeSecretPrevious = append(h.ScopeSecretPrevious, value)
		} else if name == "store_responses" {
			store, ok := map[string]bool{"on": true, "off": false}[value]
			if !ok {
				return d.Errf("idempotency: store_responses %q: want on or off", value)
			}
			h.StoreResponses = &store
		} else if to, ok := strs[name]; ok {
			*to = value
		} else if to, ok := durs[name]; ok {
			var v time.Duration
			v, err = caddy.ParseDuration(value)
			*to = caddy.Duration(v)
		} else if to, ok := ints[name]; ok {
			*to, err = strconv.ParseInt(value, 10, 64)
		} else {
			return d.Errf("idempotency: unknown option %q", name)
		}
		if err != nil {
			return d.Errf("idempotency: %s %q: %v", name, value, err)
		}
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var m Handler
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return &m, err
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
