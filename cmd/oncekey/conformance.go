package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/service/httpapi"
)

// Run checks the API at --url against the operations of --spec and writes
// the report: any failed check is an error (exit 1); a run that could not
// start (the document, the overrides, the URL or the credentials), or
// checks that could not run with none failed, exit 2 (see
// conformanceCmd.Help).
func (c *conformanceCmd) Run(e env) error {
	var err error
	if c.Auth, err = secret("--auth-file", c.AuthFile, c.Auth); err != nil {
		return setupFailed(err)
	}
	if c.Auth2, err = secret("--auth2-file", c.Auth2File, c.Auth2); err != nil {
		return setupFailed(err)
	}
	doc, notices, err := conformance.Load(c.Spec)
	// What the tool cannot support is said, and the run goes on without
	// it: a large public API's document has something of the kind.
	for _, n := range notices {
		fmt.Fprintf(e.stderr, "oncekey conformance: %s\n", n)
	}
	if err != nil {
		return setupFailed(fmt.Errorf("--spec %s: %w", c.Spec, pathless(err)))
	}
	var overrides conformance.Overrides
	if c.Overrides != "" {
		if overrides, err = conformance.ReadOverrides(c.Overrides); err != nil {
			return setupFailed(fmt.Errorf("--overrides %s: %w", c.Overrides, pathless(err)))
		}
	}
	return c.check(e, doc, overrides)
}

func (c *conformanceCmd) check(e env, doc *openapi3.T, overrides conformance.Overrides) error {
	profile, err := conformance.ProfileNamed(c.Profile)
	if err != nil {
		return setupFailed(err)
	}
	cfg := conformance.Config{
		Spec: doc, BaseURL: c.URL, Auth: c.Auth, Auth2: c.Auth2, Profile: profile, Only: c.Only, KeyHeader: c.KeyHeader, KeyField: c.KeyField,
		Overrides: overrides, Concurrency: c.Concurrency, Timeout: c.Timeout,
		RetentionWait: c.RetentionWait, Progress: progress(e),
	}
	if c.Plan || c.Explain {
		plans, err := conformance.Plan(cfg)
		if err != nil {
			return setupFailed(err)
		}
		if c.Plan {
			return conformance.WritePlan(e.stdout, c.Format, plans)
		}
		if err := conformance.WritePlan(e.stderr, "text", plans); err != nil {
			return err
		}
	}
	if c.URL == "" {
		return setupFailed(errors.New("--url is required (unless --plan)"))
	}
	results, err := conformance.Run(e.ctx, cfg)
	var setup conformance.SetupError
	if errors.As(err, &setup) {
		return setupFailed(err)
	}
	if err != nil && len(results) == 0 {
		return printableError{err}
	}
	if werr := conformance.Write(e.stdout, c.Format, profile, results); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	if c.WriteOverrides != "" {
		if err := c.writeOverrides(e, cfg, results); err != nil {
			return err
		}
	}
	switch sum := conformance.Summarize(results); {
	case sum.Failed > 0 && sum.Errors > 0:
		return fmt.Errorf("conformance: %d of %d checks failed, and %d could not run", sum.Failed, len(results), sum.Errors)
	case sum.Failed > 0:
		return fmt.Errorf("conformance: %d of %d checks failed", sum.Failed, len(results))
	case sum.Errors > 0:
		return exitError{code: exitSetup, err: fmt.Errorf("conformance: %d of %d checks could not run: no working request could be made (the report says what each needs)", sum.Errors, len(results))}
	}
	return nil
}

// writeOverrides writes --write-overrides: a starter overrides file for
// the operations whose requests could not be made.
func (c *conformanceCmd) writeOverrides(e env, cfg conformance.Config, results []conformance.Result) error {
	var b bytes.Buffer
	n, err := conformance.WriteOverrides(&b, cfg, results)
	if err != nil {
		return fmt.Errorf("--write-overrides: %w", err)
	}
	if err := os.WriteFile(c.WriteOverrides, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("--write-overrides: %w", err)
	}
	_, err = fmt.Fprintf(e.stderr, "oncekey conformance: wrote %s: %d operations to fill in, then run again with --overrides %s\n", c.WriteOverrides, n, c.WriteOverrides)
	return err
}

// printableError is an error that quotes what others wrote (the
// document, the API's answers), made Printable for the terminal it is
// printed on.
type printableError struct{ err error }

func (e printableError) Error() string { return conformance.Printable(e.err.Error()) }
func (e printableError) Unwrap() error { return e.err }

// exitSetup is conformance's exit code when the run could not start (the
// document, the overrides, the URL or the credentials), or no check failed
// but some could not run: the tool needs a hint (overrides, a credential),
// and the API broke no promise it was seen to. 1 is kept for a broken
// promise alone, so that CI can trust it.
const exitSetup = 2

// setupFailed is err as conformance exits on a run that could not start:
// exit 2, one line on standard error, made Printable (it may quote the
// document, or the overrides).
func setupFailed(err error) error {
	return exitError{code: exitSetup, err: printableError{err}}
}

// pathless is err without the path of an *fs.PathError, which the caller
// says already ("--spec x.yaml: open x.yaml: no such file" says it twice).
func pathless(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil {
		return pe.Err
	}
	return err
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
		line := fmt.Sprintf("conformance: %d/%d %s %s %s", done, total, r.Status, r.Check, conformance.Printable(r.Operation))
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
	key, err := secret("--api-key-file", c.APIKeyFile, c.APIKey)
	if err != nil {
		return err
	}
	if key == "" {
		// kong's words, for a flag it cannot require: one of the two, or
		// the variable, gives it.
		return errors.New("missing flags: --api-key=KEY (or $ONCEKEY_API_KEY, or --api-key-file=FILE)\n(see 'oncekey contract-test --help')")
	}
	cmd := conformanceCmd{URL: c.URL, Auth: "Bearer " + key, Profile: "oncekey", Format: "text", Concurrency: 10, Timeout: 10 * time.Second}
	return cmd.check(e, doc, overrides)
}

// secret is a credential flag's value: the flag's own (given on the
// command line or in its variable), or else the one line of its file flag,
// the way to keep a secret out of the arguments, which process lists and
// CI logs show. The line's end is dropped; the file's path may be said in
// an error, its contents never.
func secret(fileFlag, file, value string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", fileFlag, err)
	}
	line := strings.TrimRight(string(b), "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("%s %s: the file is empty", fileFlag, file)
	case strings.ContainsAny(line, "\r\n"):
		return "", fmt.Errorf("%s %s: the file has more than one line", fileFlag, file)
	}
	return line, nil
}
