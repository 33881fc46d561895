package client

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// decode reads the answer to one request, sent with the generated client:
// the success value in its body, or a *ProblemError with the response. A
// transport error, or an answer cut off before its body was read, comes
// back without a response, as the network error it is (which the retry
// loop retries: the key makes that safe).
func decode[T any](resp *http.Response, err error) (*T, *http.Response, error) {
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("oncekey: read the answer: %w", err)
	}
	if err := problemOf(resp, body); err != nil {
		return nil, resp, err
	}
	out := new(T)
	if err := json.Unmarshal(body, out); err != nil {
		return nil, resp, fmt.Errorf("oncekey: HTTP %d: decode the body: %w", resp.StatusCode, err)
	}
	return out, resp, nil
}

// problemOf returns a *ProblemError for any answer that is not a final
// success (202 request-in-progress included), nil for the other 2xx.
func problemOf(resp *http.Response, body []byte) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && !inProgress(resp) {
		return nil
	}
	e := &ProblemError{Status: resp.StatusCode}
	_ = json.Unmarshal(body, &e.Problem) // a body that is not a problem leaves it empty
	return e
}

// inProgress reports whether resp is a 202 request-in-progress: another
// request with the key is still running, and a retry gets its outcome. The
// 202 of a long operation is not: its body (application/json) is the
// accepted resource, the operation's answer.
func inProgress(resp *http.Response) bool {
	if resp.StatusCode != http.StatusAccepted {
		return false
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mediaType != "application/json"
}
