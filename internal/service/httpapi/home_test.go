package httpapi_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/internal/service/buildinfo"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

// noRedirects is a client that shows a redirect instead of following it.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// TestHomePage: whoever opens the service's address in a browser gets a
// page naming its versions and linking the reference and the contract,
// not a problem+json 404.
func TestHomePage(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	doc, err := httpapi.LoadSpec()
	require.NoError(t, err)

	resp, err := http.Get(b.url + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, "default-src 'none'; img-src data:", resp.Header.Get("Content-Security-Policy"), "the page loads nothing")
	for name, value := range httpapi.SecurityHeaders {
		require.Equal(t, value, resp.Header.Get(name), name)
	}
	page := string(readAll(t, resp.Body))
	require.Contains(t, page, `<a href="/docs">`)
	require.Contains(t, page, `<a href="/openapi.yaml">`)
	text := html.UnescapeString(page)
	require.Contains(t, text, "API version "+doc.Info.Version)
	require.Contains(t, text, buildinfo.Version(), "the build, as `oncekey version` names it")

	head, err := http.Head(b.url + "/")
	require.NoError(t, err)
	head.Body.Close()
	require.Equal(t, http.StatusOK, head.StatusCode)
	require.EqualValues(t, len(page), head.ContentLength, "HEAD says the size GET sends")

	post, err := http.Post(b.url+"/", "text/plain", nil)
	require.NoError(t, err)
	post.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, post.StatusCode)
	require.Equal(t, []string{"GET", "HEAD"}, post.Header.Values("Allow"))
	require.Equal(t, "application/problem+json", post.Header.Get("Content-Type"))
}

// TestDocsWithASlashMovesToDocs: /docs/ is a permanent redirect to /docs,
// keeping the query; nothing else under /docs/ moves.
func TestDocsWithASlashMovesToDocs(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	tests := []struct {
		name, method, path, location string
	}{
		{"GET", http.MethodGet, "/docs/", "/docs"},
		{"HEAD", http.MethodHead, "/docs/", "/docs"},
		{"with a query", http.MethodGet, "/docs/?tab=orders", "/docs?tab=orders"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(tt.method, b.url+tt.path, nil)
			require.NoError(t, err)
			resp, err := noRedirects.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
			require.Equal(t, tt.location, resp.Header.Get("Location"))
		})
	}

	followed, err := http.Get(b.url + "/docs/")
	require.NoError(t, err)
	followed.Body.Close()
	require.Equal(t, http.StatusOK, followed.StatusCode)
	require.Equal(t, "/docs", followed.Request.URL.Path, "the redirect lands on the reference page")
}

// TestOtherUnknownPathsAreStillProblems: the home page and the redirect
// take exactly their paths; every other unknown path is the problem+json
// 404 it always was.
func TestOtherUnknownPathsAreStillProblems(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	for _, path := range []string{"/nowhere", "/index.html", "/docs/x", "/docs//", "/docs/assets/", "/openapi.yaml/"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			resp, err := noRedirects.Get(b.url + path)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusNotFound, resp.StatusCode)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		})
	}
}

// noscript is the page's <noscript> element and the first link in it.
var noscript = regexp.MustCompile(`(?s)<noscript>.*?<a href="([^"]+)">.*?</noscript>`)

// TestDocsPageLinksTheContractWithoutJavaScript: with scripts off, the
// reference page still leads to the contract it renders, and the link
// answers with that contract.
func TestDocsPageLinksTheContractWithoutJavaScript(t *testing.T) {
	t.Parallel()
	b := setup(t, memory.New(), options{})
	page, err := b.http.Get(b.url + "/docs")
	require.NoError(t, err)
	defer page.Body.Close()
	require.Equal(t, http.StatusOK, page.StatusCode)
	m := noscript.FindStringSubmatch(string(readAll(t, page.Body)))
	require.NotNil(t, m, "the page has a <noscript> link")

	link, err := url.Parse(m[1])
	require.NoError(t, err)
	spec, err := b.http.Get(page.Request.URL.ResolveReference(link).String())
	require.NoError(t, err)
	defer spec.Body.Close()
	require.Equal(t, http.StatusOK, spec.StatusCode)
	require.Equal(t, "application/yaml", spec.Header.Get("Content-Type"))
	require.Equal(t, oncekey.OpenAPISpec, readAll(t, spec.Body), "the link serves the embedded contract")
}
