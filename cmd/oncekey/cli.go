package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/buildinfo"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

// cli is the command line. Every setting is a flag and an environment
// variable (the flag wins), and the help of each command names both.
type cli struct {
	Serve        serveCmd        `cmd:"" help:"Serve the API: on PostgreSQL with --database-url, else in memory with a demo account."`
	Migrate      migrateCmd      `cmd:"" help:"Apply the database migrations (the idempotency engine's, Oncekey's, River's)."`
	Purge        purgeCmd        `cmd:"" help:"Delete expired idempotency keys in batches, or count them with --dry-run."`
	Keys         keysCmd         `cmd:"" help:"The idempotency keys, for operators: views of them, and the settling of a gateway's keys whose outcome is unknown."`
	Payments     paymentsCmd     `cmd:"" help:"Read-only views of the payments and refunds, for operators."`
	Accounts     accountsCmd     `cmd:"" help:"Create accounts and revoke API keys."`
	Proxy        proxyCmd        `cmd:"" help:"Put the Idempotency-Key protocol in front of any HTTP API: a reverse proxy to --upstream whose covered routes (--spec or --routes) run exactly once per key. See docs/gateway.md."`
	Conformance  conformanceCmd  `cmd:"" help:"Check any API's Idempotency-Key behaviour from its OpenAPI document. It runs the operations it checks many times: use a test account (on a sandbox provider)."`
	ContractTest contractTestCmd `cmd:"" name:"contract-test" help:"Deprecated alias, kept for one release: conformance against an Oncekey deployment, with its own openapi.yaml and api/conformance.yaml."`
	Version      versionCmd      `cmd:"" help:"Print the version and the VCS revision this binary was built from."`

	// badValues are the bad flag values parsing went past (see lenient),
	// for run to report all at once. Unexported: not part of the grammar.
	badValues *valueNotes
}

// env is what a command needs besides its flags: the process's context,
// standard streams and environment (a map in tests), and a logger.
type env struct {
	ctx    context.Context
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

type databaseFlags struct {
	DatabaseURL string `name:"database-url" envvar:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL URL; pgxpool settings such as pool_max_conns may be given in it."`
	keyScopeFlag
}

// keyScopeFlag is the key table's scope type, which every command that
// opens the database, serve included, must be given alike.
type keyScopeFlag struct {
	KeyScope string `name:"key-scope" envvar:"ONCEKEY_KEY_SCOPE" enum:"bytea,uuid" default:"bytea" help:"SQL type of the key table's account column (scope), chosen when the table is created and given the same ever after: uuid on a database sharded by account (Citus), so that a key lands on its account's shard."`
}

// keys is the key table's options as this flag gives them.
func (k keyScopeFlag) keys() pgstore.Options {
	return pgstore.Options{Scope: pgstore.ScopeType(k.KeyScope)}
}

func (d databaseFlags) require() error {
	if d.DatabaseURL == "" {
		return errNoDatabase
	}
	return nil
}

// redisFlags are the Redis fast path in front of PostgreSQL, as serve and
// proxy both take it.
type redisFlags struct {
	RedisURL    string `name:"redis-url" envvar:"REDIS_URL" placeholder:"URL" help:"Optional Redis fast path (redis://host:6379/0, or redis+cluster://host1:6379,host2:6379 for a Redis Cluster); any Redis failure falls back to PostgreSQL."`
	RedisSecret string `name:"redis-secret" envvar:"ONCEKEY_REDIS_SECRET" placeholder:"SECRET" help:"Authenticates the responses cached in Redis (HMAC), so that nothing else that can write there can forge a replay: the same on every replica, 32 characters or more; best given in the environment. Unset: a random one per process, and each replica replays from Redis only what it cached itself."`
}

// protocolFlags are the protocol's timing, as serve and proxy both take it.
type protocolFlags struct {
	TTL           time.Duration `name:"ttl" envvar:"IDEMPOTENCY_TTL" default:"48h" help:"How long a key's response is kept and replayed."`
	Wait          time.Duration `name:"wait" envvar:"IDEMPOTENCY_WAIT" default:"1s" help:"How long a duplicate waits for the request still running before it gets 202."`
	RepeatWindow  time.Duration `name:"repeat-window" envvar:"IDEMPOTENCY_REPEAT_WINDOW" default:"5m" help:"How long each process remembers a request to spot the same request sent again under a new key (a client making a key per attempt): counted, logged, refused with --refuse-repeats. 0: off."`
	RefuseRepeats bool          `name:"refuse-repeats" envvar:"IDEMPOTENCY_REFUSE_REPEATS" help:"Refuse such a repeat with 409 repeated-request instead of running it; a client that means it sends Idempotency-Repeat: ?1."`
}

// check reports what is wrong with the protocol's timing, for serve and
// proxy alike.
func (f protocolFlags) check(p *flagProblems) {
	p.positive("ttl", "IDEMPOTENCY_TTL", f.TTL)
	p.positive("wait", "IDEMPOTENCY_WAIT", f.Wait)
	if f.RepeatWindow < 0 {
		p.bad("--repeat-window (IDEMPOTENCY_REPEAT_WINDOW) %s: want a duration, or 0 for off", f.RepeatWindow)
	}
}

// repeatWindow is --repeat-window as the engine takes it: 0 is off.
func (f protocolFlags) repeatWindow() time.Duration {
	if f.RepeatWindow == 0 {
		return -1
	}
	return f.RepeatWindow
}

// serverFlags bound a listening command's connections, shutdown and
// cleanup, as serve and proxy both take them.
type serverFlags struct {
	ShutdownTimeout time.Duration `name:"shutdown-timeout" envvar:"ONCEKEY_SHUTDOWN_TIMEOUT" default:"30s" help:"How long SIGTERM waits for requests that are running."`
	CleanupInterval time.Duration `name:"cleanup-interval" envvar:"ONCEKEY_CLEANUP_INTERVAL" default:"1m" help:"How often expired keys are purged."`
	CleanupBatch    int           `name:"cleanup-batch" envvar:"ONCEKEY_CLEANUP_BATCH" default:"1000" help:"Rows per purge statement."`
	MaxConns        int           `name:"max-conns" envvar:"ONCEKEY_MAX_CONNS" default:"0" help:"Connections held at once (0: three quarters of the open-file limit, at most 10000)."`
	MaxInFlight     int           `name:"max-in-flight" envvar:"ONCEKEY_MAX_IN_FLIGHT" default:"0" help:"Requests running at once; beyond it 503 with Retry-After (0: 256)."`
	WriteTimeout    time.Duration `name:"write-timeout" envvar:"ONCEKEY_WRITE_TIMEOUT" default:"10s" help:"How long a client may leave a write of the answer untaken, plus its size at --min-write-rate; past it, the connection is closed and its slot freed."`
	MinWriteRate    int64         `name:"min-write-rate" envvar:"ONCEKEY_MIN_WRITE_RATE" default:"32768" help:"Bytes a second a client must read an answer at, beyond --write-timeout's grace."`
}

// check reports what is wrong with the flags that pace the answers.
func (f serverFlags) check(p *flagProblems) {
	p.positive("write-timeout", "ONCEKEY_WRITE_TIMEOUT", f.WriteTimeout)
	p.within("min-write-rate", "ONCEKEY_MIN_WRITE_RATE", f.MinWriteRate, 1<<10, 1<<30, "")
}

// recordCacheFlag sizes the in-process cache of completed records, which
// serve and proxy both keep.
type recordCacheFlag struct {
	RecordCacheSize int `name:"record-cache-size" envvar:"ONCEKEY_RECORD_CACHE_SIZE" default:"10000" help:"Completed records kept in process (0: none)."`
}

type serveCmd struct {
	DatabaseURL          string `name:"database-url" envvar:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL URL (pgxpool settings such as pool_max_conns may be given in it); empty: in memory, lost on exit."`
	DatabaseReplicaURL   string `name:"database-replica-url" envvar:"DATABASE_REPLICA_URL" placeholder:"URL" help:"Optional streaming replica of DATABASE_URL for the reads that may lag (orders, a payment, the bonus balance; Consistency: strong reads the primary)."`
	GroupCommitByAccount bool   `name:"group-commit-by-account" envvar:"ONCEKEY_GROUP_COMMIT_BY_ACCOUNT" help:"Merge only one account's concurrent first requests into a commit, so that each commit stays on one shard of a database sharded by account."`
	keyScopeFlag
	redisFlags
	protocolFlags
	serverFlags
	recordCacheFlag
	Addr                string        `name:"addr" envvar:"ONCEKEY_ADDR" default:"127.0.0.1:8080" help:"Listen address of the API (:8080 for every interface)."`
	MetricsAddr         string        `name:"metrics-addr" envvar:"ONCEKEY_METRICS_ADDR" placeholder:"HOST:PORT" help:"Serve /metrics on this internal address instead of on the API's (the profiling endpoints only ever on --pprof-addr)."`
	MaxBodyBytes        int64         `name:"max-body-bytes" envvar:"ONCEKEY_MAX_BODY_BYTES" default:"65536" help:"Larger request bodies get 413 (the largest valid order is under 10 KB)."`
	RequestTimeout      time.Duration `name:"request-timeout" envvar:"ONCEKEY_REQUEST_TIMEOUT" default:"10s" help:"Bound on each request's work, database calls included; past it, 503."`
	DemoAPIKey          string        `name:"demo-api-key" envvar:"ONCEKEY_DEMO_API_KEY" placeholder:"KEY" help:"The demo account's API key: in memory, ${demo_key} unless given; on PostgreSQL, only while given (the account is created once, and its key disabled at every start without this). A full-strength key: ok_ and 43 base64url characters."`
	AllowWeakDemoAPIKey bool          `name:"allow-weak-demo-api-key" envvar:"ONCEKEY_ALLOW_WEAK_DEMO_API_KEY" help:"Take a --demo-api-key that is not a full-strength key (a throwaway setup's, such as ${demo_key})."`
	Tracing             string        `name:"tracing" envvar:"ONCEKEY_TRACING" default:"off" help:"off, or stdout: print OpenTelemetry spans as JSON."`
	APIKeyCacheTTL      time.Duration `name:"api-key-cache-ttl" envvar:"ONCEKEY_API_KEY_CACHE_TTL" default:"10s" help:"How long a looked-up API key is trusted in process; a revoked key may keep working this long on each replica."`
	PprofAddr           string        `name:"pprof-addr" envvar:"ONCEKEY_PPROF_ADDR" placeholder:"HOST:PORT" help:"Serve the profiling endpoints (/debug/pprof/) on this internal address; off unless set."`

	ProviderURL           string        `name:"provider-url" envvar:"ONCEKEY_PROVIDER_URL" placeholder:"URL" help:"The payment provider's base URL (empty: the sandbox provider in process, with the FAKEPROVIDER_* faults)."`
	ProviderTimeout       time.Duration `name:"provider-timeout" envvar:"ONCEKEY_PROVIDER_TIMEOUT" default:"10s" help:"How long one call to the provider may take."`
	PaymentAttempts       int           `name:"payment-attempts" envvar:"ONCEKEY_PAYMENT_ATTEMPTS" default:"8" help:"Charge attempts before a payment is settled from what the provider holds."`
	PaymentRetryBase      time.Duration `name:"payment-retry-base" envvar:"ONCEKEY_PAYMENT_RETRY_BASE" default:"1s" help:"Wait after the first failed attempt; doubles per attempt."`
	PaymentRetryMax       time.Duration `name:"payment-retry-max" envvar:"ONCEKEY_PAYMENT_RETRY_MAX" default:"2m" help:"The longest wait between attempts."`
	PaymentAttemptTimeout time.Duration `name:"payment-attempt-timeout" envvar:"ONCEKEY_PAYMENT_ATTEMPT_TIMEOUT" default:"30s" help:"Bound on one attempt (longer than --provider-timeout)."`
	PaymentWorkers        int           `name:"payment-workers" envvar:"ONCEKEY_PAYMENT_WORKERS" default:"10" help:"Charges worked at once per process."`
}

func (s *serveCmd) Run(e env) error {
	cfg, err := s.config(e.getenv)
	if err != nil {
		return err
	}
	return serve(e.ctx, cfg, e.log, e.stdout)
}

type migrateCmd struct {
	databaseFlags
}

func (m *migrateCmd) Run(e env) error {
	if err := m.require(); err != nil {
		return err
	}
	return withDatabase(e.ctx, m.databaseFlags, func(*postgres.Store) error {
		e.log.Info("migrations applied")
		return nil
	})
}

type purgeCmd struct {
	databaseFlags
	DryRun bool `name:"dry-run" help:"Count the expired keys without deleting them."`
	Batch  int  `name:"cleanup-batch" envvar:"ONCEKEY_CLEANUP_BATCH" default:"1000" help:"Rows per delete statement (1 to 100000)."`
}

type keysCmd struct {
	Inspect keysInspectCmd `cmd:"" help:"Show one key's record: status (processing, completed, or a gateway key's held, unknown or not-stored), fingerprint, timestamps, stored status code (never the body), and a gateway key's held record (holder, path, reason)."`
	Resolve keysResolveCmd `cmd:"" help:"Settle a gateway key whose outcome is unknown with the answer the upstream gave (found out by hand): its retries replay it. Written to the audit trail (keys audit), with --operator and --reason."`
	Release keysReleaseCmd `cmd:"" help:"Free a gateway key whose outcome is unknown, once the operation is known not to have run: its next retry runs it. Written to the audit trail (keys audit), with --operator and --reason."`
	Stats   keysStatsCmd   `cmd:"" help:"Keys by status, table size, oldest processing key, cleanup lag."`
	Stuck   keysStuckCmd   `cmd:"" help:"List keys processing for longer than --older-than."`
	Unknown keysUnknownCmd `cmd:"" help:"List a gateway's keys whose outcome is unknown (marked so, or held by a gateway whose lease ended), oldest first: namespace, scope, key, method, route, path, since when, the gateway that held it and why. Where the OncekeyOutcomeUnknown alert's runbook starts."`
	Audit   keysAuditCmd   `cmd:"" help:"List the audit trail of resolve and release, newest first: when, the operator and the database role, the action, namespace, scope and key, the key's previous state, done or refused (and why), the reason, the SHA-256 of the body."`
}

// Help is the keys commands' detailed help: what they do to the database.
func (keysCmd) Help() string {
	return "Every keys command opens only the key table: on a database without one it creates it " +
		"(the engine's migrations, never the service's), and it reads or changes no other table, " +
		"so the commands serve a gateway's database (oncekey proxy) as well as the service's. " +
		"inspect, stats, stuck, unknown and audit only read; resolve and release change one key each, and write a row of the audit trail " +
		"(the key table's, read by keys audit) in the same transaction; a refused attempt writes one too."
}

type keysInspectCmd struct {
	databaseFlags
	keyArgs
}

// keyArgs name one key: whose it is, and the key.
type keyArgs struct {
	Account   string `arg:"" help:"The account id the key belongs to; with --gateway, the scope oncekey proxy read (a header's value, a JWT claim, or sha256:HEX of an Authorization value)."`
	Key       string `arg:"" help:"The Idempotency-Key."`
	Gateway   bool   `name:"gateway" help:"ACCOUNT is a gateway's scope, as oncekey proxy keys by it."`
	Namespace string `name:"namespace" placeholder:"NS" help:"With --gateway, the gateway's namespace (as keys unknown shows it). Unset: the key is looked for in every namespace (a scan of the key table), and used when one namespace holds it; a key stored before namespaces is found so too."`
}

type keysResolveCmd struct {
	databaseFlags
	keyArgs
	Status      int    `name:"status" required:"" help:"The status the upstream answered with (200 to 499)."`
	BodyFile    string `name:"body-file" placeholder:"FILE" help:"The body the upstream answered with (empty: none)."`
	ContentType string `name:"content-type" default:"application/json" help:"The body's Content-Type."`
	changeArgs
}

type keysReleaseCmd struct {
	databaseFlags
	keyArgs
	changeArgs
}

// changeArgs say who changes a key and why, for the audit trail.
type changeArgs struct {
	Reason   string `name:"reason" required:"" help:"Why, for the audit trail (a ticket, who checked the upstream)."`
	Operator string `name:"operator" placeholder:"NAME" help:"Who makes the change, for the audit trail (default: the OS user running the command; the trail also keeps the database role)."`
}

type keysAuditCmd struct {
	databaseFlags
	Scope     string `name:"scope" help:"List only the rows of this gateway scope (as keys unknown shows it), in every namespace unless --namespace says which."`
	Key       string `name:"key" help:"List only the rows of this Idempotency-Key."`
	Namespace string `name:"namespace" placeholder:"NS" help:"List only this gateway namespace's rows."`
	Since     string `name:"since" placeholder:"WHEN" help:"List only the rows written since then: a duration back from now (24h) or a time (RFC 3339)."`
	Limit     int    `name:"limit" default:"100" help:"List at most this many, newest first."`
}

type keysStatsCmd struct {
	databaseFlags
}

type keysStuckCmd struct {
	databaseFlags
	OlderThan time.Duration `name:"older-than" default:"10m" help:"List keys processing for longer than this."`
	Limit     int           `name:"limit" default:"100" help:"List at most this many."`
}

type keysUnknownCmd struct {
	databaseFlags
	Namespace string `name:"namespace" placeholder:"NS" help:"List only this gateway namespace's keys."`
	Limit     int    `name:"limit" default:"1000" help:"List at most this many (keys stats counts them all)."`
}

type paymentsCmd struct {
	Stuck paymentsStuckCmd `cmd:"" help:"List payments and refunds pending for longer than --older-than, and the charge and refund jobs given up."`
}

type paymentsStuckCmd struct {
	databaseFlags
	OlderThan time.Duration `name:"older-than" default:"30m" help:"List payments and refunds pending for longer than this (the retries of the defaults take about 5 minutes)."`
	Limit     int           `name:"limit" default:"100" help:"List at most this many of each."`
}

type accountsCmd struct {
	Create    accountsCreateCmd `cmd:"" help:"Create an account and print its API key once; a name in use already is refused unless --allow-duplicate-name."`
	RevokeKey accountsRevokeCmd `cmd:"" name:"revoke-key" help:"Revoke the API key read from standard input (never an argument, so it stays out of process lists). Replicas refuse it within their --api-key-cache-ttl (ONCEKEY_API_KEY_CACHE_TTL, 10s by default)."`
}

type accountsCreateCmd struct {
	databaseFlags
	Name               string `arg:"" help:"The account's name."`
	AllowDuplicateName bool   `name:"allow-duplicate-name" help:"Create it even if an account of that name exists."`
}

type accountsRevokeCmd struct {
	databaseFlags
}

type conformanceCmd struct {
	Spec           string        `name:"spec" required:"" placeholder:"FILE" help:"The API's OpenAPI document (3.0 or 3.1, YAML or JSON); a $ref to another file is reported on standard error and left out."`
	URL            string        `name:"url" placeholder:"URL" help:"Base URL of the API, e.g. http://127.0.0.1:8080 (required unless --plan)."`
	Auth           string        `name:"auth" envvar:"ONCEKEY_AUTH" xor:"auth" placeholder:"CREDENTIAL" help:"Credential of a test account: \"X-API-Key: ...\" (a header), \"Bearer sk_test_...\", or a bare value, sent where the spec's securitySchemes say. An argument shows in process lists: use --auth-file or the variable."`
	AuthFile       string        `name:"auth-file" xor:"auth" placeholder:"FILE" help:"Read --auth from this file (its one line)."`
	Auth2          string        `name:"auth2" envvar:"ONCEKEY_AUTH2" xor:"auth2" placeholder:"CREDENTIAL" help:"Credential of a second account, in the same forms; without it credential-isolation is skipped. Like --auth: --auth2-file or the variable."`
	Auth2File      string        `name:"auth2-file" xor:"auth2" placeholder:"FILE" help:"Read --auth2 from this file (its one line)."`
	Profile        string        `name:"profile" enum:"oncekey,ietf,ietf-07,stripe,agent-commerce" default:"oncekey" help:"Which answers keep the promises: oncekey (409 mismatch, 202 in flight), ietf (the IETF draft -06: 422, 409), ietf-07 (draft -07, which asks the same), stripe (400, 409, key optional), agent-commerce (the Agentic Commerce Protocol: 422, 409 with Retry-After, 400 without a key, Idempotent-Replayed)."`
	KeyHeader      string        `name:"key-header" xor:"key" placeholder:"NAME" help:"Send the key in this header, for a document that does not say where (X-Idempotency-Key, PayPal-Request-Id): the operations that declare it are covered, or, where none does, every POST and PATCH. The document's own place is read from a header parameter ending in Idempotency-Key or x-idempotency's key-header."`
	KeyField       string        `name:"key-field" xor:"key" placeholder:"NAME" help:"Send the key as this top-level member of the body (idempotency_key, or the pointer /idempotency_key), for a document that does not say so (x-idempotency's key-field does): the operations whose body declares it are covered, or, where none does, every POST and PATCH that takes a body."`
	Only           []string      `name:"only" sep:"," placeholder:"ID" help:"Run only these checks and/or operations (\"POST /orders\" or an operationId)."`
	Format         string        `name:"format" enum:"text,json,junit" default:"text" help:"Report format on standard output: text, json or junit."`
	Overrides      string        `name:"overrides" placeholder:"FILE" help:"YAML of request bodies, path parameters, headers, slow, failing and large requests, and skipped checks per operation (see docs/conformance.md)."`
	Concurrency    int           `name:"concurrency" default:"10" help:"How many identical requests the concurrency checks send at once."`
	Timeout        time.Duration `name:"timeout" default:"10s" help:"Bound on each request."`
	RetentionWait  time.Duration `name:"retention-wait" default:"0s" placeholder:"DURATION" help:"How long a key must at least be kept: retention retries a key after it (sooner where the answer advertises a shorter Idempotency-TTL) and wants a replay; it waits that long for each operation. 0 skips retention."`
	Plan           bool          `name:"plan" help:"Send nothing: list the operations under the protocol, their first requests and where each value comes from (--format text or json)."`
	WriteOverrides string        `name:"write-overrides" placeholder:"FILE" help:"After the checks, write a starter overrides file with an entry for each operation whose requests could not be made (the errors), with blanks to fill in."`
	Explain        bool          `name:"explain" help:"Before the checks, write to standard error where each value of every operation's requests comes from (example, schema, link, Location, name match, override)."`
}

// Help is conformance's detailed help: what its exit codes mean, for CI.
func (conformanceCmd) Help() string {
	return "Exit status: 0 when every check passed or was skipped; 1 when a check " +
		"failed (the API broke a promise of the protocol); 2 when " +
		"the run could not start, with one line on standard error and no report (nothing " +
		"answers HTTP at --url, TLS fails there, --spec or --overrides cannot be read or " +
		"loaded, no operation declares Idempotency-Key, a credential cannot be placed), " +
		"or when none failed but some are errors: they could not run, as no working " +
		"request could be made (a request made from the spec was refused, or no resource " +
		"it names could be made), and each says what the tool needs; --write-overrides " +
		"starts a file that gives it."
}

type contractTestCmd struct {
	URL        string `name:"url" required:"" placeholder:"URL" help:"Base URL of the deployment, e.g. http://127.0.0.1:8080."`
	APIKey     string `name:"api-key" envvar:"ONCEKEY_API_KEY" xor:"api-key" placeholder:"KEY" help:"API key of a test account. An argument shows in process lists: use --api-key-file or the variable."`
	APIKeyFile string `name:"api-key-file" xor:"api-key" placeholder:"FILE" help:"Read --api-key from this file (its one line)."`
}

type versionCmd struct{}

func (versionCmd) Run(e env) error {
	_, err := fmt.Fprintln(e.stdout, buildinfo.Version())
	return err
}

// exited is how kong's exit (after --help) unwinds to run.
type exited struct{ code int }

// parser builds the command line's parser, writing to stdout and stderr
// and reading environment variables through getenv.
func parser(c *cli, getenv func(string) string, stdout, stderr io.Writer) (*kong.Kong, error) {
	c.badValues = &valueNotes{env: map[*kong.Value]string{}}
	opts := append(lenientMappers(c.badValues),
		kong.Name("oncekey"),
		kong.Description("Oncekey makes unsafe API operations happen exactly once, however often clients retry."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(exited{code}) }),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, WrapUpperBound: 80}),
		kong.ValueFormatter(helpWithVariable),
		kong.Vars{"demo_key": DemoAPIKey},
		kong.Resolvers(envResolver{getenv: getenv, notes: c.badValues}),
	)
	return kong.New(c, opts...)
}

// errNoCommand is plain `oncekey`: a command line that names nothing to
// do. run has printed the usage to standard error; the exit status is 2,
// a usage error, so that a script or a container started without its
// command fails visibly instead of passing.
var errNoCommand = errors.New("no command given; `oncekey --help` prints the usage")

// run parses args and runs the command they name. `oncekey help [command]`
// is `oncekey [command] --help`; plain `oncekey` prints the usage to
// standard error and returns errNoCommand.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && args[0] == "help" {
		args = append(append([]string(nil), args[1:]...), "--help")
	}
	var c cli
	k, err := parser(&c, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return usage(k, stderr)
	}
	defer func() {
		if v := recover(); v != nil {
			x, ok := v.(exited)
			if !ok {
				panic(v)
			}
			if x.code != 0 {
				err = fmt.Errorf("exit status %d", x.code)
			}
		}
	}()
	kctx, err := k.Parse(args)
	// The bad values kong parsed past (see lenient) make one report with
	// kong's own error, or with what the command's checks find.
	bad := c.badValues.problems
	if err != nil {
		var perr *kong.ParseError
		if !errors.As(err, &perr) {
			return err
		}
		if len(bad) > 0 { // an unknown flag, say, after bad values
			bad.bad("%s", err)
			err = bad
		} else if m := missingArgument.FindStringSubmatch(err.Error()); m != nil && perr.Context != nil && perr.Context.Selected() != nil {
			// kong's own words name only the first argument missing.
			node := perr.Context.Selected()
			err = fmt.Errorf("missing %s: the command is 'oncekey %s'", m[1], node.Summary())
		}
		return fmt.Errorf("%w\n(see '%s --help')", err, commandOf(perr.Context))
	}
	if len(bad) > 0 {
		if node := kctx.Selected(); node != nil {
			if checker, ok := node.Target.Addr().Interface().(flagChecker); ok {
				bad = append(bad, checker.checkFlags(getenv)...)
			}
		}
		return bad
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	return kctx.Run(env{ctx: ctx, getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr, log: log})
}

// missingArgument is kong's error for a positional argument not given
// (`expected "<key>"`).
var missingArgument = regexp.MustCompile(`^expected "(<[^"]+>)"`)

// usage prints the usage, as --help does, to w, and returns errNoCommand.
func usage(k *kong.Kong, w io.Writer) error {
	kctx, err := kong.Trace(k, nil)
	if err != nil {
		return err
	}
	k.Stdout = w
	if err := kctx.PrintUsage(false); err != nil {
		return err
	}
	return errNoCommand
}

// commandOf is the command a parse error is about, as typed.
func commandOf(kctx *kong.Context) string {
	if kctx == nil || kctx.Selected() == nil {
		return "oncekey"
	}
	return kctx.Selected().FullPath()
}

// envResolver gives every flag with an environment variable (its envvar
// tag) the value the variable has in getenv: the process's environment, or
// a map in tests. A flag given on the command line wins, and so does one
// that excludes it (its xor group's: --auth-file over ONCEKEY_AUTH). (kong's
// own env tag would read the process's environment whatever getenv is.)
type envResolver struct {
	getenv func(string) string
	// notes learns which variable each value came from, so that a bad
	// one is reported under its name (kong converts it right after).
	notes *valueNotes
}

func (envResolver) Validate(*kong.Application) error { return nil }

func (r envResolver) Resolve(_ *kong.Context, path *kong.Path, flag *kong.Flag) (any, error) {
	name := flag.Tag.Get("envvar")
	if name == "" {
		return nil, nil
	}
	for _, other := range path.Flags {
		if other != flag && other.Set && slices.ContainsFunc(other.Xor, func(x string) bool { return slices.Contains(flag.Xor, x) }) {
			return nil, nil
		}
	}
	v := r.getenv(name)
	if v == "" {
		return nil, nil
	}
	r.notes.env[flag.Value] = name
	return v, nil
}

// helpWithVariable is each flag's help, followed by its environment
// variable.
func helpWithVariable(value *kong.Value) string {
	name := value.Tag.Get("envvar")
	if name == "" {
		return value.Help
	}
	return strings.TrimSuffix(value.Help, ".") + " ($" + name + ")."
}
