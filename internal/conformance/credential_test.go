package conformance

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// credentialDoc is a document of two covered operations, a and b, with the
// security given (YAML flow lines, "" for none) and every scheme the tests
// name, or the schemes given.
func credentialDoc(t *testing.T, docSecurity, aSecurity, bSecurity, schemes string) *openapi3.T {
	t.Helper()
	if schemes == "" {
		schemes = `{
    header: {type: apiKey, in: header, name: X-API-Key},
    query: {type: apiKey, in: query, name: api_key},
    cookie: {type: apiKey, in: cookie, name: session_key},
    basic: {type: http, scheme: basic},
    bearer: {type: http, scheme: Bearer},
    digest: {type: http, scheme: digest},
    oidc: {type: openIdConnect, openIdConnectUrl: 'https://example.com/.well-known/openid-configuration'},
    mtls: {type: mutualTLS}}`
	}
	src := fmt.Sprintf(`
openapi: 3.1.0
info: {title: t, version: "1"}
%s
paths:
  /a:
    post:
      operationId: a
      %s
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      responses: {'200': {description: ok}}
  /b:
    post:
      operationId: b
      %s
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      responses: {'200': {description: ok}}
components:
  securitySchemes: %s
`, docSecurity, aSecurity, bSecurity, schemes)
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData([]byte(src))
	require.NoError(t, err, src)
	require.NoError(t, doc.Validate(loader.Context), src)
	return doc
}

// Each form of --auth goes where it says, and a bare value where the
// document's security says; what cannot be placed is an error at start
// that names the scheme and the form that works.
func TestCredentialPlacement(t *testing.T) {
	t.Parallel()
	header := func(name, value string) credential { return credential{in: "header", name: name, value: value} }
	basic := func(v string) credential {
		return header("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(v)))
	}
	tests := []struct {
		name                       string
		auth                       string
		docSec, aSec, bSec, scheme string // security: of the document, a, b; the schemes ("": all)
		want                       credential
		err                        []string // the error says each
	}{
		{name: "none", auth: "", docSec: "security: [{mtls: []}]"},
		{name: "a header", auth: "X-API-Key: k1", want: header("X-API-Key", "k1")},
		{name: "a header after a tab, trailing space", auth: "X-API-Key:\tk1 ", want: header("X-API-Key", "k1")},
		{name: "a header wins over the document", auth: "X-API-Key: k1", docSec: "security: [{basic: []}]", want: header("X-API-Key", "k1")},
		{name: "a colon and a space is a header, even with Basic declared", auth: "alice: pw", docSec: "security: [{basic: []}]", want: header("alice", "pw")},
		{name: "a scheme and its value", auth: "Bearer tok", docSec: "security: [{query: []}]", want: header("Authorization", "Bearer tok")},
		{name: "Basic pre-encoded", auth: "Basic YWxpY2U6cHc=", docSec: "security: [{basic: []}]", want: header("Authorization", "Basic YWxpY2U6cHc=")},
		{name: "a scheme and its value, with mutualTLS declared", auth: "Token t", docSec: "security: [{mtls: []}]", want: header("Authorization", "Token t")},
		{name: "bare, no requirement and several schemes", auth: "tok", want: header("Authorization", "tok")},
		{name: "bare, no schemes at all", auth: "tok", scheme: "{}", want: header("Authorization", "tok")},
		{name: "bare, no requirement and one scheme", auth: "tok", scheme: "{q: {type: apiKey, in: query, name: key}}", want: credential{"query", "key", "tok"}},
		{name: "bare, api key header", auth: "tok", docSec: "security: [{header: []}]", want: header("X-API-Key", "tok")},
		{name: "bare, api key query", auth: "tok", docSec: "security: [{query: []}]", want: credential{"query", "api_key", "tok"}},
		{name: "bare, api key cookie", auth: "tok", docSec: "security: [{cookie: []}]", want: credential{"cookie", "session_key", "tok"}},
		{name: "bare, bearer (scheme in any case)", auth: "tok", docSec: "security: [{bearer: []}]", want: header("Authorization", "Bearer tok")},
		{name: "bare, openIdConnect as bearer", auth: "tok", docSec: "security: [{oidc: [openid]}]", want: header("Authorization", "Bearer tok")},
		{name: "bare user:password, basic", auth: "alice:pw", docSec: "security: [{basic: []}]", want: basic("alice:pw")},
		{name: "bare user:password with a space in the password, basic", auth: "alice:p w", docSec: "security: [{basic: []}]", want: basic("alice:p w")},
		{name: "bare key, basic: a user with no password", auth: "sk_test", docSec: "security: [{basic: []}]", want: basic("sk_test:")},
		{name: "bare with a colon, api key: the key as given", auth: "id:secret", docSec: "security: [{header: []}]", want: header("X-API-Key", "id:secret")},
		{name: "the first requirement placeable", auth: "tok", docSec: "security: [{mtls: []}, {digest: []}, {query: []}, {header: []}]", want: credential{"query", "api_key", "tok"}},
		{name: "an optional credential", auth: "tok", docSec: "security: [{}, {header: []}]", want: header("X-API-Key", "tok")},
		{name: "the operation's security over the document's", auth: "tok", docSec: "security: [{bearer: []}]", aSec: "security: [{header: []}]", bSec: "security: [{header: []}, {bearer: []}]", want: header("X-API-Key", "tok")},
		{name: "the one place every operation takes", auth: "tok", aSec: "security: [{bearer: []}, {header: []}]", bSec: "security: [{header: []}]", want: header("X-API-Key", "tok")},
		{name: "an operation without security asks for nothing", auth: "tok", docSec: "security: [{mtls: []}]", aSec: "security: []", bSec: "security: [{cookie: []}]", want: credential{"cookie", "session_key", "tok"}},
		{name: "no operation asks, several schemes", auth: "tok", docSec: "security: [{mtls: []}]", aSec: "security: []", bSec: "security: []", want: header("Authorization", "tok")},
		{name: "mutualTLS only", auth: "tok", docSec: "security: [{mtls: []}]",
			err: []string{"--auth:", "POST /a", "mtls (mutualTLS)", `"Header-Name: value"`}},
		{name: "digest only", auth: "tok", docSec: "security: [{digest: []}]",
			err: []string{"digest (http digest)", `"Header-Name: value"`}},
		{name: "two schemes together", auth: "tok", docSec: "security: [{header: [], query: []}]",
			err: []string{"header (apiKey in header X-API-Key) and query (apiKey in query api_key)", `"Header-Name: value"`}},
		{name: "no one place for every operation", auth: "tok", aSec: "security: [{bearer: []}]", bSec: "security: [{header: []}]",
			err: []string{"no one place", "POST /a asks for bearer (http Bearer)", "POST /b asks for header (apiKey in header X-API-Key)"}},
		{name: "a header without a value", auth: "X-API-Key: ", err: []string{"X-API-Key", "no value"}},
		{name: "a newline", auth: "tok\r\nX-Evil: 1", err: []string{"control character"}},
		{name: "a cookie value a cookie cannot hold", auth: "a;b", docSec: "security: [{cookie: []}]", err: []string{"cookie session_key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := credentialDoc(t, tt.docSec, tt.aSec, tt.bSec, tt.scheme)
			for _, flag := range []string{"--auth", "--auth2"} {
				cfg := Config{Spec: doc, BaseURL: "http://127.0.0.1:1", Auth: tt.auth}
				if flag == "--auth2" {
					cfg = Config{Spec: doc, BaseURL: "http://127.0.0.1:1", Auth: "X-Other: o", Auth2: tt.auth}
				}
				s, err := newSession(cfg)
				if len(tt.err) > 0 {
					require.Error(t, err, flag)
					require.Contains(t, err.Error(), flag+":", "the error names the flag")
					for _, part := range tt.err {
						require.Contains(t, err.Error(), replaceFlag(part, flag), flag)
					}
					require.NotContains(t, err.Error(), "tok", "the error does not show the credential")
					continue
				}
				require.NoError(t, err, flag)
				got := s.auth
				if flag == "--auth2" {
					got = s.auth2
				}
				require.Equal(t, tt.want, got, flag)
			}
		})
	}
}

func replaceFlag(part, flag string) string {
	if part == "--auth:" {
		return flag + ":"
	}
	return part
}

// A credential goes on a request as its place says: it replaces a query
// parameter of its name, keeps the others as they were written, and joins
// the cookies already there.
func TestCredentialApply(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		c           credential
		url, cookie string // the request's
		wantQuery   string
		wantHeader  http.Header
	}{
		{"none", credential{}, "http://h/p?a=1", "", "a=1", http.Header{}},
		{"a header", credential{"header", "x-api-key", "k"}, "http://h/p", "", "", http.Header{"X-Api-Key": {"k"}}},
		{"the query, alone", credential{"query", "api_key", "k&=+ %"}, "http://h/p", "", "api_key=k%26%3D%2B+%25", http.Header{}},
		{"the query, replacing its own name", credential{"query", "api_key", "k"}, "http://h/p?a=%61+b&api_key=example&api%5Fkey=x&b=2", "", "a=%61+b&b=2&api_key=k", http.Header{}},
		{"a cookie, alone", credential{"cookie", "session_key", "k"}, "http://h/p", "", "", http.Header{"Cookie": {"session_key=k"}}},
		{"a cookie, with others", credential{"cookie", "session_key", "k"}, "http://h/p", "tenant=t", "", http.Header{"Cookie": {"tenant=t; session_key=k"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(http.MethodPost, tt.url, nil)
			require.NoError(t, err)
			if tt.cookie != "" {
				req.Header.Set("Cookie", tt.cookie)
			}
			tt.c.apply(req)
			require.Equal(t, tt.wantQuery, req.URL.RawQuery, "the query")
			require.Equal(t, tt.wantHeader, req.Header, "the headers")
		})
	}
}

// bothSchemes serves h over TLS and over plain HTTP on one address, as a
// server answering https:// and http:// on one host and port does: it
// tells the two apart by the first byte a connection sends (a TLS
// handshake's is 0x16). It returns the address and a client that trusts
// its certificate.
func bothSchemes(t *testing.T, h http.Handler) (addr string, client *http.Client) {
	t.Helper()
	certified := httptest.NewTLSServer(http.NotFoundHandler())
	certified.Close() // its certificate and its client are what is used
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(sniffing{ln, certified.TLS}) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), certified.Client()
}

// sniffing is a listener whose connections are TLS when they begin with a
// TLS handshake, and plain otherwise.
type sniffing struct {
	net.Listener
	tls *tls.Config
}

func (l sniffing) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		first, err := br.Peek(1)
		_ = c.SetReadDeadline(time.Time{})
		if err != nil {
			_ = c.Close()
			continue
		}
		pc := peeked{c, br}
		if first[0] == 0x16 {
			return tls.Server(pc, l.tls), nil
		}
		return pc, nil
	}
}

// peeked is a connection whose first bytes were read into r.
type peeked struct {
	net.Conn
	r *bufio.Reader
}

func (c peeked) Read(p []byte) (int, error) { return c.r.Read(p) }

// An API under test served over https whose Location names http:// on
// its own host and port gets nothing sent there: a credential never goes
// over plain HTTP, where anyone on the path reads it, though the host is
// the API's own. A Location on the API's own origin is followed, with the
// credential: the server reached over either scheme is the same.
func TestCredentialsNeverGoFromHTTPSToHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, auth, scheme string
	}{
		{"in a header", "Bearer secret-token", ""},
		{"in the query", "secret-token", "{q: {type: apiKey, in: query, name: api_key}}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[bool][]string{} // over TLS → each request's URL and Authorization
			addr, client := bothSchemes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				seen[r.TLS != nil] = append(seen[r.TLS != nil], r.URL.String()+" "+r.Header.Get("Authorization"))
				w.WriteHeader(http.StatusOK)
			}))
			base := "https://" + addr
			s, err := newSession(Config{Spec: credentialDoc(t, "", "", "", tt.scheme), BaseURL: base, Auth: tt.auth})
			require.NoError(t, err)
			s.validator.Base = client.Transport
			ctx := context.Background()
			q := request{method: http.MethodPost, path: "/a"}

			_, err = s.get(ctx, s.location(q, base+"/a/1"))
			require.NoError(t, err, "a Location on the API's own origin is followed")
			_, err = s.get(ctx, s.location(q, "http://"+addr+"/a/2"))

			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, seen[false], "nothing went over plain HTTP (each request: its URL and Authorization)")
			require.Len(t, seen[true], 1, "the Location over https was followed")
			require.Contains(t, seen[true][0], "secret-token", "with the credential")
			var skip skipped
			require.ErrorAs(t, err, &skip, "the check that would follow the Location over http says why it cannot")
			require.Contains(t, err.Error(), "credentials are sent to the API under test alone")
		})
	}
}
