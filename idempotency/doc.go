// Package idempotency makes an unsafe HTTP operation run at most once per
// (scope, Idempotency-Key) and answers every repeat with the stored response
// of the first, as the IETF httpapi Idempotency-Key draft describes.
//
// A client sends Idempotency-Key with a POST (or PATCH, DELETE, ...). The
// key is scoped to the caller (Config.Scope: a tenant, a user), the
// request is fingerprinted (method, route, path, query and its body, read
// as its Content-Type says: see below), and the key is claimed in a Store:
//
//   - a new key runs the operation; its response is stored with the key and
//     sent;
//   - the same key and request again get that response back, byte for byte,
//     with Idempotent-Replayed: true, and nothing runs;
//   - the same key with a different request is 409 (ErrKeyMismatch);
//   - the same key while the first request still runs waits up to
//     Config.Wait (or the operation's own OperationConfig.Wait), then gets
//     202 with Retry-After (ErrInFlight);
//   - a request refused before its operation ran (a bad key, a bad body),
//     an answer whose status says the request may be sent again as it is
//     (400, 401, 403, 408, 413, 415, 429, 499) and any 5xx
//     store nothing and consume no key; every other answer, 404, 409 and
//     422 included, is stored and replayed.
//
// Every answer once the key is looked up (every answer of Operation.Serve)
// carries Idempotency-TTL: how long the operation keeps a key, in whole
// seconds from its first request (OperationConfig.TTL, else Config.TTL),
// so that a client knows how long a retry is covered; docs/protocol.md
// gives the rule and its reasons.
//
// # Requests repeated under new keys
//
// A client that makes a new key per attempt runs the operation once per
// attempt, and no key can tell. So an operation remembers, on this process
// and for Config.RepeatWindow, the requests it ran, and reports the same
// request (scope, operation, fingerprint) under another key to
// Observer.Repeated and in a log line without keys; with RefuseRepeats it
// refuses it (409 repeated-request) unless the client says the repeat is
// meant (Idempotency-Repeat: ?1, Request.Repeat).
//
// # Request bodies
//
// The operation, and Config.Validate, read the body exactly as the client
// sent it. The fingerprint covers its meaning, so that a retry spelled
// otherwise is the same request, and ignores only what no parser of the
// body reads, so that two requests with one fingerprint are never read
// differently (Request.Fingerprint computes it for any front door or
// tool; docs/protocol.md lists every difference it ignores):
//
//   - JSON (no Content-Type, application/json or any +json type): its
//     canonical form, so member order, whitespace and the spelling of
//     strings do not matter, nor that of numbers of one exact decimal
//     value (1.0 and 1, -0 and 0; never 123456789.123456789123 and
//     123456789.12345679); and its media type, unless it is
//     application/json (with charset=utf-8 or none) or none, so that
//     application/merge-patch+json is another request. A body that is not
//     JSON, or whose meaning is ambiguous (duplicate keys, invalid UTF-8,
//     nesting deeper than 64, an exponent of more than 9 digits), is
//     ErrMalformedBody.
//   - Forms (application/x-www-form-urlencoded): its canonical form. "+"
//     or "%20" for a space, "%7E" or "~", "%2f" or "%2F", a raw byte or
//     its escape and empty pairs ("a=1&&b=2") do not matter; the order of
//     the fields does, all of them (Rack and PHP build arrays from it), as
//     do "a" against "a=" (nil and "" to Rack and others), the case of
//     keys and every decoded byte. Form bodies are UTF-8, as the WHATWG
//     URL standard defines them: a charset parameter other than utf-8, a
//     malformed percent escape, decoded bytes that are not UTF-8, and a
//     ";" (a separator to some servers, refused by Go's) are refused
//     as malformed-form (see ProblemOf).
//   - Any other media type (multipart/form-data, application/octet-stream,
//     text/plain, ...): its exact bytes and its media type with its
//     parameters (in any order, and type, subtype and parameter names in
//     any case; parameter values as sent), so that the same bytes under
//     another Content-Type are another request.
//
// A Content-Type that does not parse, or more than one, is refused as
// malformed-content-type, and a query string that does not parse (a
// ";", a malformed percent escape) is ErrMalformedQuery. Each of these
// refusals is a 400 that runs nothing and consumes no key. A body without
// content (empty, JSON whitespace, a form without fields) is fingerprinted
// as no body, whatever its type.
//
// Fingerprints of these rules carry a marker; a record stored by an
// engine before them (numbers read as doubles, forms sorted by name, JSON
// media types not hashed) is still matched by the request it was stored
// for, under the rules it was stored by, so an upgrade loses no key.
//
// # Units of work
//
// The operation writes through the lease's unit of work, whose type U the
// store defines: the store commits those writes and the stored response
// together, or neither. Package pgstore hands out a pgx.Tx (or, for a
// write-only operation, writes queued to go with the claim in one round
// trip); memstore an undo log; MapUnit turns either into an application's
// own repositories. redisstore and recordcache go in front of any store to
// answer replays without a database round trip.
//
// An operation is declared once, with its store, and so with the type of
// unit its handler writes through:
//
//	engine := idempotency.New(idempotency.Config{Scope: tenantOf})
//	create := idempotency.NewOperation(engine, keys, idempotency.OperationConfig{})
//	mux.Handle("POST /widgets", create.HandlerFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
//		// insert through tx; write the response
//	}))
//
// Package oapi declares the operations of an OpenAPI document that take an
// Idempotency-Key, for services generated with oapi-codegen.
package idempotency
