package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// TestScopeOfNamesOneCaller: a scope template resolves only when each of
// its placeholders is known and holds one value, and the scope as stored
// fits the stores; anything else is ErrNoScope (401), saying why.
func TestScopeOfNamesOneCaller(t *testing.T) {
	t.Parallel()
	const user = "user:{http.request.header.X-User}"
	request := func(header ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/charges?to=a&to=b", nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
		caddyhttp.NewTestReplacer(r)
		return r
	}
	for _, tc := range []struct {
		name, template, ns string
		req                *http.Request
		want, why          string // the scope, or why there is none
	}{
		{"one header", user, "", request("X-User", "alice"), "user:alice", ""},
		{"namespaced", user, "shop", request("X-User", "alice"), "ns:shop|user:alice", ""},
		{"a bare placeholder", "{http.request.header.X-User}", "", request("X-User", "alice"), "alice", ""},
		{"no header", user, "shop", request(), "", "{http.request.header.X-User} is empty"},
		{"an empty header", user, "", request("X-User", ""), "", "{http.request.header.X-User} is empty"},
		{"an empty bare placeholder", "{http.request.header.X-User}", "", request(), "", "is empty"},
		{"two headers, which Caddy joins", user, "", request("X-User", "bob", "X-User", "alice"), "", "{http.request.header.X-User} has 2 values"},
		{"two query values", "{http.request.uri.query.to}", "", request(), "", "{http.request.uri.query.to} has 2 values"},
		{"two cookies of one name", "{http.request.cookie.sid}", "", request("Cookie", "sid=a; SID=b"), "", "{http.request.cookie.sid} has 2 values"},
		{"one of two placeholders empty", user + ":{http.request.header.X-Org}", "", request("X-User", "alice"), "", "{http.request.header.X-Org} is empty"},
		{"an unknown placeholder", "user:{http.request.heder.X-User}", "", request("X-User", "alice"), "", "{http.request.heder.X-User} is unknown"},
		{"at the limit", user, "", request("X-User", strings.Repeat("a", 250)), "user:" + strings.Repeat("a", 250), ""},
		{"over the limit", user, "", request("X-User", strings.Repeat("a", 251)), "", "the scope is 256 bytes; this site takes at most 255"},
		{"at the limit with a namespace", user, "shop", request("X-User", strings.Repeat("a", 242)), "ns:shop|user:" + strings.Repeat("a", 242), ""},
		{"over it only with the namespace", user, "shop", request("X-User", strings.Repeat("a", 243)), "", "the scope is 248 bytes; this site takes at most 247"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := scopeOf(scopeRule{template: tc.template, ns: tc.ns})(tc.req)
			if tc.why == "" {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				require.LessOrEqual(t, len(got), idempotency.MaxScopeLength)
				return
			}
			require.ErrorIs(t, err, idempotency.ErrNoScope)
			require.ErrorContains(t, err, tc.why)
			require.Empty(t, got)
			p := idempotency.ProblemOf(err)
			require.Equal(t, http.StatusUnauthorized, p.Status)
		})
	}
}

// TestScopeWithoutAPlaceholderIsRefused: a scope template that is the same
// for every request fails validation, so Caddy does not start with it.
func TestScopeWithoutAPlaceholderIsRefused(t *testing.T) {
	t.Parallel()
	for template, why := range map[string]string{
		"acme":                                                "holds no placeholder",
		`user:\{http.request.header.X-User}`:                  "holds no placeholder",
		"user:{http.request.header.X-User":                    "opens a placeholder it does not close",
		"{http.request.header.X-User}":                        "",
		"org:{http.request.header.X-Org}:{http.auth.user.id}": "",
	} {
		err := (&Handler{Scope: template}).Validate()
		if why == "" {
			require.NoError(t, err, template)
			continue
		}
		require.ErrorContains(t, err, why, template)
	}
}

// TestScopeSecretIsLongEnough: scope_secret and each scope_secret_previous
// take 32 bytes or more once their placeholders are replaced (an {env.…}
// that is unset is empty), or provisioning fails.
func TestScopeSecretIsLongEnough(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", minSecret)
	for _, tc := range []struct {
		name     string
		h        Handler
		wantErr  string
		previous int
	}{
		{"long enough", Handler{ScopeSecret: long, ScopeSecretPrevious: []string{long + "old"}}, "", 1},
		{"short", Handler{ScopeSecret: long[1:]}, "scope_secret has 31 bytes", 0},
		{"an unset variable", Handler{ScopeSecret: "{env.ONCEKEY_TEST_UNSET_SCOPE_SECRET}"}, "scope_secret has 0 bytes", 0},
		{"a short previous one", Handler{ScopeSecret: long, ScopeSecretPrevious: []string{"old"}}, "scope_secret_previous has 3 bytes", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rule, err := tc.h.scopeRule()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, rule.secret)
			require.Equal(t, []byte(long), rule.secret.secret)
			require.Len(t, rule.previous, tc.previous)
		})
	}
}
