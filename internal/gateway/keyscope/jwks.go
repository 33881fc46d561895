package keyscope

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// JWKS is the key set of a file, which an identity provider rotates: Reload
// reads it again, and Watch does so on every tick and every signal, so
// that a removed key stops verifying, and a new one starts, within one
// tick.
type JWKS struct {
	path string
	keys atomic.Pointer[jose.JSONWebKeySet]
	mu   sync.Mutex // serialises reloads
	raw  []byte     // the file as last read, under mu
}

// LoadJWKS reads the JWKS file at path.
func LoadJWKS(path string) (*JWKS, error) {
	k := &JWKS{path: path}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Keys is the key set as last read.
func (k *JWKS) Keys() jose.JSONWebKeySet { return *k.keys.Load() }

// Reload reads the file again, and reports whether its keys changed. A
// file that cannot be read, or holds no valid signing key, leaves the keys
// as they were (the error says why): a half-written file must not lock
// every caller out.
func (k *JWKS) Reload() (changed bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	raw, err := os.ReadFile(k.path)
	if err != nil {
		return false, fmt.Errorf("keyscope: read the JWKS: %w", err)
	}
	if k.raw != nil && bytes.Equal(raw, k.raw) {
		return false, nil
	}
	keys, err := ParseJWKS(raw)
	if err != nil {
		return false, fmt.Errorf("keyscope: %s: %w", k.path, err)
	}
	k.keys.Store(&keys)
	k.raw = raw
	return true, nil
}

// ParseJWKS reads a JWKS, keeping its signing keys: a key whose use is
// given and is not "sig" (an encryption key) never verifies a token.
func ParseJWKS(raw []byte) (jose.JSONWebKeySet, error) {
	var all jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &all); err != nil {
		return jose.JSONWebKeySet{}, fmt.Errorf("not a JWKS: %w", err)
	}
	var keys jose.JSONWebKeySet
	for _, k := range all.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if secret, ok := k.Key.([]byte); ok && len(secret) < 32 {
			// RFC 7518 §3.2: an HMAC key at least as long as its hash.
			return jose.JSONWebKeySet{}, fmt.Errorf("the JWKS secret %q is %d bytes, under the 32 that HS256 needs", k.KeyID, len(secret))
		} else if !ok && !k.Valid() {
			return jose.JSONWebKeySet{}, fmt.Errorf("the JWKS key %q is not valid", k.KeyID)
		}
		keys.Keys = append(keys.Keys, k)
	}
	if len(keys.Keys) == 0 {
		return jose.JSONWebKeySet{}, errors.New("the JWKS has no signing keys (use absent or \"sig\")")
	}
	return keys, nil
}

// DefaultJWKSRefresh is how often the gateway reads its JWKS file again by
// default: the longest a removed key keeps verifying.
const DefaultJWKSRefresh = 30 * time.Second

// Watch reloads the keys every interval and on every value of now (a
// SIGHUP), until ctx ends, logging each change and each failure.
func (k *JWKS) Watch(ctx context.Context, interval time.Duration, now <-chan os.Signal, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var why string
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			why = "refresh"
		case s := <-now:
			why = s.String()
		}
		changed, err := k.Reload()
		switch {
		case err != nil:
			log.ErrorContext(ctx, "scope JWKS: could not reload; the keys stay as they were", "path", k.path, "on", why, "err", err)
		case changed:
			log.InfoContext(ctx, "scope JWKS: reloaded", "path", k.path, "on", why, "keys", len(k.Keys().Keys))
		}
	}
}
