// Package docspage serves the service's pages for people: the API reference
// page, Redoc rendering the embedded openapi.yaml, and the home page that
// points at it. Redoc's bundle is vendored into assets/ (see vendor.sh) and
// embedded, so the page works offline and loads nothing from a CDN.
package docspage

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with the page: scripts and the spec only
// from this origin; Redoc injects its styles inline and runs a blob worker.
const ContentSecurityPolicy = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:"

// HomeContentSecurityPolicy is sent with the home page, which runs no
// script and loads nothing but its empty inline icon.
const HomeContentSecurityPolicy = "default-src 'none'; img-src data:"

// home is the home page. The icon is an empty inline one, as on the
// reference page, so that browsers do not ask for /favicon.ico.
var home = template.Must(template.New("home").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Oncekey</title>
  <link rel="icon" href="data:,">
</head>
<body>
  <h1>Oncekey</h1>
  <p>Oncekey makes unsafe API operations happen exactly once, however often clients retry.</p>
  <ul>
    <li><a href="/docs">API reference</a></li>
    <li><a href="/openapi.yaml">openapi.yaml</a>: the contract, as this server enforces it</li>
  </ul>
  <p>API version {{.API}}; {{.Build}}.</p>
</body>
</html>
`))

// Home returns the home page (GET /): what the service is, the version of
// its API (the contract's info.version) and of its build (as `oncekey
// version` prints it), and links to the reference page and the contract.
func Home(api, build string) []byte {
	var page bytes.Buffer
	if err := home.Execute(&page, struct{ API, Build string }{api, build}); err != nil {
		panic(err) // two strings into a fixed template
	}
	return page.Bytes()
}

// HTML returns the reference page (GET /docs).
func HTML() []byte {
	page, err := assets.ReadFile("assets/index.html")
	if err != nil {
		panic(err) // embedded at build time
	}
	return page
}

// Assets serves the page's static files under /docs/assets/; anything
// else (a missing file, the directory itself) goes to notFound, so it is
// answered like every other unknown path.
func Assets(notFound http.HandlerFunc) http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	const prefix = "/docs/assets/"
	files := http.StripPrefix(prefix, http.FileServer(http.FS(sub)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, prefix)
		if info, err := fs.Stat(sub, name); err != nil || info.IsDir() || name == r.URL.Path {
			notFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}
