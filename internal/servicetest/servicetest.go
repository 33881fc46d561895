// Package servicetest is what the black-box tests of several packages share
// when they talk to the running service over HTTP: building requests and
// reading whole replies. It is imported only by tests.
package servicetest

import (
	"fmt"
	"io"
	"net/http"
)

// Reply is a whole response, read at once so bodies can be compared byte
// for byte and goroutines can hand it back over a channel.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r Reply) String() string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// NewRequest builds a request with the API key and, when there is a body,
// Content-Type application/json. Header pairs follow: the first pair for a
// name replaces that header, later pairs for the same name add values (to
// send a header twice), and an empty value deletes the header.
func NewRequest(method, url, apiKey string, body io.Reader, header ...string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return nil, fmt.Errorf("build %s %s: %w", method, url, err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(header); i += 2 {
		name, value := http.CanonicalHeaderKey(header[i]), header[i+1]
		if !seen[name] {
			req.Header.Del(name)
			seen[name] = true
		}
		if value != "" {
			req.Header.Add(name, value)
		}
	}
	return req, nil
}

// Exchange sends req with client and reads the whole reply. It returns
// errors instead of failing a test, so goroutines can use it.
func Exchange(client *http.Client, req *http.Request) (Reply, error) {
	resp, err := client.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{}, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL.Path, err)
	}
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}
