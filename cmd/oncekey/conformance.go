package main

import (
	"fmt"
	"os"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/httpapi"
)

// Run checks the API at --url against the operations of --spec and writes
// the report; any failed check is an error (exit 1).
func (c *conformanceCmd) Run(e env) error {
	doc, notices, err := conformance.Load(c.Spec)
	// What the tool cannot support is said, and the run goes on without
	// it: a large public API's document has something of the kind.
	for _, n := range notices {
		fmt.Fprintf(e.stderr, "oncekey conformance: %s\n", n)
	}
	if err != nil {
		return fmt.Errorf("--spec %s: %w", c.Spec, err)
	}
	var overrides conformance.Overrides
	if c.Overrides != "" {
		if overrides, err = conformance.ReadOverrides(c.Overrides); err != nil {
			return fmt.Errorf("--overrides %s: %w", c.Overrides, err)
		}
	}
	return c.check(e, doc, overrides)
}

func (c *conformanceCmd) check(e env, doc *openapi3.T, overrides conformance.Overrides) error {
	profile, err := conformance.ProfileNamed(c.Profile)
	if err != nil {
		return err
	}
	results, err := conformance.Run(e.ctx, conformance.Config{
		Spec: doc, BaseURL: c.URL, Auth: c.Auth, Auth2: c.Auth2, Profile: profile, Only: c.Only,
		Overrides: overrides, Concurrency: c.Concurrency, Timeout: c.Timeout, Progress: progress(e),
	})
	if err != nil && len(results) == 0 {
		return err
	}
	if werr := conformance.Write(e.stdout, c.Format, profile, results); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	if sum := conformance.Summarize(results); sum.Failed > 0 {
		return fmt.Errorf("conformance: %d of %d checks failed", sum.Failed, len(results))
	}
	return nil
}

// progress reports each check on standard error as it ends: on one line
// rewritten in place on a terminal, a line each elsewhere (CI logs).
func progress(e env) func(done, total int, r conformance.Result) {
	f, ok := e.stderr.(*os.File)
	tty := false
	if ok {
		if fi, err := f.Stat(); err == nil {
			tty = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	return func(done, total int, r conformance.Result) {
		line := fmt.Sprintf("conformance: %d/%d %s %s %s", done, total, r.Status, r.Check, r.Operation)
		switch {
		case !tty:
			fmt.Fprintln(e.stderr, line)
		case done == total:
			fmt.Fprintf(e.stderr, "\r\033[K")
		default:
			fmt.Fprintf(e.stderr, "\r\033[K%s", line)
		}
	}
}

// Run is conformance against an Oncekey deployment, with the openapi.yaml
// and api/conformance.yaml this binary was built with.
func (c *contractTestCmd) Run(e env) error {
	doc, err := httpapi.LoadSpec()
	if err != nil {
		return err
	}
	overrides, err := conformance.ParseOverrides(oncekey.ConformanceOverrides)
	if err != nil {
		return err
	}
	cmd := conformanceCmd{URL: c.URL, Auth: "Bearer " + c.APIKey, Profile: "oncekey", Format: "text", Concurrency: 10, Timeout: 10 * time.Second}
	return cmd.check(e, doc, overrides)
}
