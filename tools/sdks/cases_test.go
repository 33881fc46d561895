package sdks_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sdkCase is a way a charge goes wrong, as an application meets it.
type sdkCase struct {
	name string
	// calls are the case's charges; id names the case's run for the
	// upstream (metadata[case]).
	calls      func(id string) []chargeCall
	sequential bool
	// restart, when set, is done while the calls run, on a gateway of the
	// case's own.
	restart func(t *testing.T, g *gateway, up *stripeUpstream, id string)
	// maxRuns is the most runs a key may have upstream.
	maxRuns int
	// check checks what the calls ended in, beyond what every case checks.
	check func(t *testing.T, s sdk, results []callResult, runs map[string]int)
}

// tenCharges are ten charges at once, with metadata.
func tenCharges(metadata map[string]string) func(id string) []chargeCall {
	return func(id string) []chargeCall {
		calls := make([]chargeCall, 10)
		for i := range calls {
			md := maps.Clone(metadata)
			md["case"] = id
			md["order"] = fmt.Sprint(i)
			calls[i] = chargeCall{Amount: int64(1000 + i), Metadata: md}
		}
		return calls
	}
}

// everyCall checks that each call ended as want says (a charge for "",
// else the SDK's error as sdkError.String has it), and each key ran runs
// times.
func everyCall(t *testing.T, results []callResult, ran map[string]int, want string, runs int) {
	t.Helper()
	for i, r := range results {
		if want == "" {
			require.True(t, r.OK, "call %d did not get its charge: %s", i, r.Error)
			continue
		}
		require.NotNil(t, r.Error, "call %d got a charge; want %s", i, want)
		require.Equal(t, want, r.Error.String(), "call %d: %+v", i, r.Error)
	}
	require.Len(t, ran, len(results), "one key a call")
	for key, n := range ran {
		require.Equal(t, runs, n, "the upstream's runs of key %s", key)
	}
}

// slowFirstAttempt: the SDK that retries a conflict gets every charge; the
// one that does not raises the gateway's 409 (in Stripe's shape) for a
// charge in flight, or gets it if its retry came once it was done. Either
// way each key ran once.
func slowFirstAttempt(t *testing.T, s sdk, results []callResult, ran map[string]int) {
	if s.retriesStripeErrors {
		everyCall(t, results, ran, "", 1)
		return
	}
	for i, r := range results {
		if !r.OK {
			require.Equal(t, s.idempotencyError+" idempotency_error 409", r.Error.String(), "call %d: %+v", i, r.Error)
		}
	}
	for key, n := range ran {
		require.Equal(t, 1, n, "the upstream's runs of key %s", key)
	}
}

var cases = []sdkCase{
	{
		// (a) The first attempt outlasts the SDK's timeout: the SDK retries
		// under the same key while the gateway holds it.
		name:    "slow-first-attempt-2.5s",
		calls:   tenCharges(map[string]string{"first_delay_ms": "2500"}),
		maxRuns: 1,
		check:   slowFirstAttempt,
	},
	{
		name:    "slow-first-attempt-4s",
		calls:   tenCharges(map[string]string{"first_delay_ms": "4000"}),
		maxRuns: 1,
		check:   slowFirstAttempt,
	},
	{
		// (b) The upstream took the request and reset the connection: the
		// outcome is unknown, and the key never runs again.
		name:    "reset-after-write",
		calls:   tenCharges(map[string]string{"first_fault": "reset"}),
		maxRuns: 1,
		check: func(t *testing.T, s sdk, results []callResult, ran map[string]int) {
			everyCall(t, results, ran, s.idempotencyError+" idempotency_error 409", 1)
		},
	},
	{
		// (c) A 5xx frees the key (docs/gateway.md): the SDK's retry runs
		// it again.
		name:    "5xx-then-success",
		calls:   tenCharges(map[string]string{"first_fault": "500"}),
		maxRuns: 2,
		check: func(t *testing.T, s sdk, results []callResult, ran map[string]int) {
			if s.retriesStripeErrors {
				everyCall(t, results, ran, "", 2)
				return
			}
			// The upstream's own 500, raised: the key is free for the
			// application's next try.
			everyCall(t, results, ran, s.idempotencyError+" api_error 500", 1)
		},
	},
	{
		// (d) The gateway killed while requests run, and started again on
		// the same database.
		name: "gateway-restarted",
		calls: func(id string) []chargeCall {
			calls := tenCharges(map[string]string{"first_delay_ms": "2000"})(id)
			for i := range calls {
				calls[i].StartAfterMS = 150 * i
			}
			return calls
		},
		restart: func(t *testing.T, g *gateway, up *stripeUpstream, id string) {
			require.Eventually(t, func() bool { return up.startedIn(id) >= 5 }, 30*time.Second, 10*time.Millisecond,
				"the upstream began 5 runs:\n%s", g.logs())
			g.crash(t)
			g.start(t)
		},
		maxRuns: 1,
	},
	{
		// (e) The application reuses its key for another amount.
		name: "key-reused-with-another-amount",
		calls: func(id string) []chargeCall {
			key := "order-" + rand.Text()
			md := map[string]string{"case": id}
			return []chargeCall{{Amount: 1000, Metadata: md, IdempotencyKey: key}, {Amount: 2000, Metadata: md, IdempotencyKey: key}}
		},
		sequential: true,
		maxRuns:    1,
		check: func(t *testing.T, s sdk, results []callResult, ran map[string]int) {
			require.True(t, results[0].OK, "the first call got its charge: %s", results[0].Error)
			second := results[1]
			require.NotNil(t, second.Error, "the second call, another amount under the same key, raised")
			require.Equal(t, s.idempotencyError+" idempotency_error 422", second.Error.String(), "%+v", second.Error)
			require.Equal(t, 1, second.Attempts, "a 422 is not retried")
		},
	},
}

// TestStripeSDKs runs Stripe's official SDKs (Node and Go), which make their
// own Idempotency-Keys and retry, through oncekey proxy and through Caddy
// with the module, each as docs/gateway.md configures it for a Stripe-shaped
// API (the default ietf profile, the Stripe error template), in front of an
// upstream that runs every request it gets. In every case each call ends in
// the upstream's own charge or in an error the SDK raises, never in a
// gateway's answer handed to the application as the charge, and the
// upstream runs each key at most once (twice after a 5xx). The summary line
// of each case is what docs/gateway.md's "Clients" section reports.
func TestStripeSDKs(t *testing.T) {
	t.Parallel()
	for _, kind := range gatewayKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t)
			shared := kind.start(t, up.url)
			for _, s := range sdks {
				for _, tc := range cases {
					t.Run(s.name+"/"+tc.name, func(t *testing.T) {
						t.Parallel()
						g := shared
						if tc.restart != nil {
							g = kind.start(t, up.url)
						}
						id := kind.name + "-" + s.name + "-" + tc.name
						run := chargeRun{
							URL:               g.url(),
							APIKey:            "sk_test_" + strings.ReplaceAll(id, "-", "_"),
							TimeoutMS:         1000,
							MaxNetworkRetries: 6,
							Sequential:        tc.sequential,
							Calls:             tc.calls(id),
						}
						ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
						defer cancel()
						type ended struct {
							results []callResult
							err     error
						}
						done := make(chan ended, 1)
						start := time.Now()
						go func() {
							results, err := s.charge(ctx, run)
							done <- ended{results, err}
						}()
						if tc.restart != nil {
							tc.restart(t, g, up, id)
						}
						end := <-done
						require.NoError(t, end.err)
						require.Len(t, end.results, len(run.Calls))

						ran := up.runsOf(keysOf(end.results))
						t.Logf("%s %s %s: %s in %.1fs", kind.name, s.name, tc.name, summary(up, end.results, ran), time.Since(start).Seconds())
						checkEnds(t, up, end.results, ran, tc.maxRuns, g)
						if tc.check != nil {
							tc.check(t, s, end.results, ran)
						}
					})
				}
			}
		})
	}
}

// keysOf are the keys the calls were sent under.
func keysOf(results []callResult) []string {
	keys := make([]string, len(results))
	for i, r := range results {
		keys[i] = r.Key
	}
	return keys
}

// checkEnds checks what every case promises: each call was sent under a
// key, and ended in a charge the upstream answered under that key or in an
// error the SDK raised; no key ran more than maxRuns times.
func checkEnds(t *testing.T, up *stripeUpstream, results []callResult, ran map[string]int, maxRuns int, g *gateway) {
	t.Helper()
	for i, r := range results {
		require.NotEmpty(t, r.Key, "call %d was sent under no Idempotency-Key", i)
		if !r.OK {
			require.NotNil(t, r.Error, "call %d ended in neither a charge nor an error", i)
			continue
		}
		require.True(t, isAnswer(r.Body, up.answered(r.Key)),
			"call %d: the application got %s as its charge, which the upstream never answered under %s\n%s", i, r.Body, r.Key, g.logs())
	}
	for key, n := range ran {
		require.LessOrEqual(t, n, maxRuns, "the upstream ran key %s %d times", key, n)
	}
}

// isAnswer tells whether body is one of the answers, as JSON.
func isAnswer(body json.RawMessage, answers []string) bool {
	var got any
	if json.Unmarshal(body, &got) != nil {
		return false
	}
	for _, a := range answers {
		var want any
		if json.Unmarshal([]byte(a), &want) == nil && reflect.DeepEqual(got, want) {
			return true
		}
	}
	return false
}

// summary is a case's counts: calls, charges, other answers the
// application got as its charge, errors by kind, runs, keys, attempts.
func summary(up *stripeUpstream, results []callResult, ran map[string]int) string {
	charged, wrong, errs := 0, 0, map[string]int{}
	minAttempts, maxAttempts := results[0].Attempts, results[0].Attempts
	for _, r := range results {
		switch {
		case r.OK && isAnswer(r.Body, up.answered(r.Key)):
			charged++
		case r.OK:
			wrong++
		default:
			errs[r.Error.String()]++
		}
		minAttempts, maxAttempts = min(minAttempts, r.Attempts), max(maxAttempts, r.Attempts)
	}
	var raised []string
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		raised = append(raised, fmt.Sprintf("%d× %s", errs[e], e))
	}
	runs := 0
	for _, n := range ran {
		runs += n
	}
	s := fmt.Sprintf("%d calls, %d charged", len(results), charged)
	if wrong > 0 {
		s += fmt.Sprintf(", %d handed another answer as the charge", wrong)
	}
	if len(raised) > 0 {
		s += ", raised " + strings.Join(raised, ", ")
	}
	return s + fmt.Sprintf("; %d runs for %d keys; attempts %d–%d", runs, len(ran), minAttempts, maxAttempts)
}
