// Package idempotency makes an unsafe HTTP operation run at most once per
// (scope, Idempotency-Key) and answers every repeat with the stored response
// of the first, as the IETF httpapi Idempotency-Key draft describes.
//
// A client sends Idempotency-Key with a POST (or PATCH, DELETE, ...). The
// key is scoped to the caller (Config.Scope: a tenant, a user), the
// request is fingerprinted (method, route, path, query and the RFC 8785
// canonical form of its JSON body), and the key is claimed in a Store:
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
//     (see Replayable: 400, 401, 403, 408, 413, 415, 429, 499) and any 5xx
//     store nothing and consume no key; every other answer, 404, 409 and
//     422 included, is stored and replayed.
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
