package idempotency

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency/internal/clock"
)

// Defaults for Config fields left zero.
const (
	defaultTTL          = 48 * time.Hour
	defaultWait         = time.Second
	defaultRetryAfter   = time.Second
	defaultMaxBodyBytes = 1 << 20
)

// minStoreWait is the least wait a claim is given after queueing behind
// duplicates on this process: enough for a claim statement that blocks on
// nothing, so a key whose holder just finished is answered from the store.
const minStoreWait = 100 * time.Millisecond

// DefaultReplayHeaders are the response headers stored with a record and
// replayed. Content-Encoding is among them because the body is stored as the
// bytes sent: an encoded body replayed without it is unreadable. Anything
// else (Date, request ids, tracing headers) is specific to one response and
// must not be handed to a different request.
var DefaultReplayHeaders = []string{"Content-Type", "Content-Encoding", "Location", "Retry-After"}

// neverReplayed are headers no configuration can store: credentials and
// cookies belong to one client and one exchange, and hop-by-hop headers to
// one connection (RFC 9110 §7.6.1). Idempotency-TTL is the operation's
// retention now, not when the record was stored.
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Cookie": true,
	"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, HeaderReplayed: true, HeaderKey: true, ttlKey: true,
}

// ErrKeyMismatch answers a request whose key holds the outcome of a
// different request (method, route, path, query or body): 409.
var ErrKeyMismatch = errors.New("this Idempotency-Key was already used with a different request (method, path, query or body); use a new key for a new operation")

// ErrBodyTooLarge answers a body over the limit (413); it consumes no key.
var ErrBodyTooLarge = errors.New("the request body is too large")

// ErrNoScope means the request has no scope to put its key in: it was not
// authenticated. Config.Scope returns it (or an error of its own).
var ErrNoScope = errors.New("the request carries no credentials to scope its Idempotency-Key to")

// Config configures an Engine. Scope is required for Operation.Handler and
// HandlerFunc (without it every request is ErrNoScope); every other field
// is optional.
type Config struct {
	// Scope returns the scope (a tenant, a user) a request's key belongs
	// to, for Operation.Handler and HandlerFunc: keys of two scopes never
	// meet. An error is answered through WriteError (ErrNoScope: 401), and
	// so is an empty scope: it would put every such caller's keys in one
	// namespace, where each could replay the others' responses.
	// Front doors that call Operation.Serve give the scope themselves.
	Scope func(r *http.Request) (string, error)
	// Route returns the matched route pattern ("/widgets/{id}"), which the
	// fingerprint binds the key to. Default: the pattern net/http's
	// ServeMux matched, without its method, or else the path.
	Route func(r *http.Request) string
	// TTL is how long a completed record is replayed (default 48h).
	TTL time.Duration
	// Wait is how long a duplicate waits for an in-flight first request
	// before it gets 202 (default 1s).
	Wait time.Duration
	// RepeatWindow is how long a request that ran is remembered, on this
	// process, so that the same request (scope, operation, fingerprint)
	// under another key is seen: a client that makes a new key per attempt
	// runs the operation once per attempt, and this is how an operator
	// finds out (Observer.Repeated, a log line without keys). Default 5
	// minutes; negative turns it off. OperationConfig.RepeatWindow and
	// RefuseRepeats set it per operation.
	RepeatWindow time.Duration
	// RefuseRepeats makes every operation refuse such a repeat, as
	// OperationConfig.RefuseRepeats makes one.
	RefuseRepeats bool
	// RetryAfter is advertised on 202 and 503 answers (default 1s).
	RetryAfter time.Duration
	// MaxBodyBytes bounds the bodies Operation.Handler and HandlerFunc
	// read (default 1 MiB).
	MaxBodyBytes int64
	// ReplayHeaders is the allow-list of stored response headers (default
	// DefaultReplayHeaders). Set-Cookie, Authorization and hop-by-hop
	// headers are never stored, whatever it says.
	ReplayHeaders []string
	// Validate, if set, checks a request's body (as sent, the bytes the
	// operation will read) before the operation runs, and before a request
	// whose key holds a different request's outcome is answered 409: an
	// error refuses it, through WriteError, and consumes no key. A body's
	// schema is checked here rather than in front of the protocol so that
	// replays, whose bodies mean what the bodies that passed when their
	// operation ran meant, do not pay for it again.
	Validate func(r *http.Request, body []byte) error
	// WriteError answers a request the protocol refuses or fails: err is
	// one of this package's errors (ErrMissingKey, ErrKeyMismatch,
	// ErrInFlight, ...), possibly wrapped, context.Canceled when the client
	// went away, an error of Scope or Validate, or a store's failure.
	// Retry-After is already set where it applies. Default: ProblemWriter
	// with ProblemTypeBase.
	WriteError func(w http.ResponseWriter, r *http.Request, err error)
	// ProblemTypeBase prefixes the type URIs of the default WriteError's
	// problem documents ("https://example.com/problems/"); empty means
	// "about:blank" for every problem.
	ProblemTypeBase string
	// Logger receives store failures (default slog.Default()).
	Logger *slog.Logger
	// Observer is told every request's outcome (default: nobody).
	Observer Observer
}

// Engine is the protocol shared by a service's operations: its settings,
// and the queue in which concurrent duplicates of one key wait on this
// process.
type Engine struct {
	cfg      Config
	stored   []string
	inFlight *collapser
	// settles are held operations' outcomes that their store did not
	// take yet (see HeldConfig.MaxPending).
	settles *pendingSettles
	// repeats are the requests of the last RepeatWindow, for spotting
	// their repeats under other keys.
	repeats *repeats
	// now is this process's clock (time.Now), which tests skew
	// (internal/clock): held records' leases must not depend on it where
	// the store keeps a clock of its own.
	now func() time.Time
}

func init() {
	clock.Set = func(e any, now func() time.Time) { e.(*Engine).now = now }
}

// New returns an engine for cfg, filling in defaults.
func New(cfg Config) *Engine {
	if cfg.TTL <= 0 {
		cfg.TTL = defaultTTL
	}
	if cfg.Wait <= 0 {
		cfg.Wait = defaultWait
	}
	if cfg.RepeatWindow == 0 {
		cfg.RepeatWindow = defaultRepeatWindow
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = defaultRetryAfter
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = defaultMaxBodyBytes
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = DefaultReplayHeaders
	}
	if cfg.Route == nil {
		cfg.Route = muxPattern
	}
	if cfg.WriteError == nil {
		cfg.WriteError = ProblemWriter(cfg.ProblemTypeBase)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	var replay []string
	for _, name := range cfg.ReplayHeaders {
		if name = http.CanonicalHeaderKey(name); !neverReplayed[name] {
			replay = append(replay, name)
		}
	}
	return &Engine{cfg: cfg, stored: replay, inFlight: newCollapser(), settles: newPendingSettles(cfg.Logger, cfg.Observer), repeats: newRepeats(), now: time.Now}
}

// muxPattern is the route net/http's ServeMux matched ("POST /widgets/{id}"
// without the method), or the path where there is none.
func muxPattern(r *http.Request) string {
	p := r.Pattern
	if p == "" {
		return r.URL.Path
	}
	for i := 0; i < len(p); i++ {
		if p[i] == ' ' {
			return p[i+1:]
		}
		if p[i] == '/' {
			break
		}
	}
	return p
}
