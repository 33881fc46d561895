package conformance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// SetupError is a run that could not start for reasons of the document,
// the URL or the credentials, not of the API's keeping of the protocol: no
// operation of the document is covered, the overrides or --only name what
// the document does not have, a credential cannot be placed, or nothing
// answers HTTP at the URL (a refused connection, a TLS handshake that
// fails, a timeout). Run and Plan return it before any check has run, so
// that CI can tell "the run never started" (exit 2) from "the API broke a
// promise" (exit 1). It is not the Error result of a check that started
// and could not make a working request: that is a result in the report.
type SetupError struct{ Err error }

func (e SetupError) Error() string { return e.Err.Error() }
func (e SetupError) Unwrap() error { return e.Err }

// probe sends one request, without credentials, to the base URL, and
// returns a SetupError if no HTTP answer comes back: any answer at all,
// 404 or 401 included, means an HTTP server is there, and the checks will
// say what it does. Without the probe, an API that is down would fail (or
// err) every check, each for the same reason. It bypasses the validating
// transport: its answer is none of an operation under test (a document may
// declare GET /, and response-valid is not to judge the probe), and its
// body is left unread.
func (s *session) probe(ctx context.Context) error {
	shown := s.cfg.BaseURL
	u, err := url.Parse(s.cfg.BaseURL)
	if err == nil {
		shown = u.Redacted() // a password in the URL stays out of the error
	}
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return SetupError{fmt.Errorf("--url %s: want an http:// or https:// URL, as http://127.0.0.1:8080", shown)}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.BaseURL, nil)
	if err != nil {
		return SetupError{fmt.Errorf("--url %s: %w", shown, unwrapURL(err))}
	}
	client := &http.Client{
		Transport: s.validator.Base, Timeout: s.cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	inner := unwrapURL(err)
	var (
		op    *net.OpError
		ne    net.Error
		rec   tls.RecordHeaderError
		alert tls.AlertError
		cert  *tls.CertificateVerificationError
		auth  x509.UnknownAuthorityError
		host  x509.HostnameError
		inval x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return SetupError{fmt.Errorf("nothing answers at %s: %w", shown, inner)}
	case errors.As(err, &ne) && ne.Timeout():
		return SetupError{fmt.Errorf("nothing answers at %s within %s (--timeout): %w", shown, s.cfg.Timeout, inner)}
	case errors.As(err, &rec), errors.As(err, &alert), errors.As(err, &cert), errors.As(err, &auth),
		errors.As(err, &host), errors.As(err, &inval),
		// net/http's words for a TLS handshake answered in plain HTTP:
		// it keeps no error type for it.
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return SetupError{fmt.Errorf("TLS fails at %s: %w", shown, inner)}
	}
	return SetupError{fmt.Errorf("no HTTP answer from %s: %w", shown, inner)}
}

// unwrapURL is the error a *url.Error holds, without its `Get "URL": `,
// which the caller says in its own words.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
