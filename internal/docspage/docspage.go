// Package docspage serves the API reference page: Redoc rendering the
// embedded openapi.yaml. Redoc's bundle is vendored into assets/ (see
// vendor.sh) and embedded, so the page works offline and loads nothing from
// a CDN.
package docspage

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with the page: scripts and the spec only
// from this origin; Redoc injects its styles inline and runs a blob worker.
const ContentSecurityPolicy = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:"

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
