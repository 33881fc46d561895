package client

import (
	"encoding/json"
	"net/http"
)

// problemOf returns a *ProblemError for any answer that is not a final
// success (202 in-progress included), nil for 2xx other than 202.
func problemOf(resp *http.Response, body []byte) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && resp.StatusCode != http.StatusAccepted {
		return nil
	}
	e := &ProblemError{Status: resp.StatusCode}
	_ = json.Unmarshal(body, &e.Problem) // a body that is not a problem leaves it empty
	return e
}
