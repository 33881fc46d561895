package main

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// valueNotes are the bad flag values that parsing went past: kong stops at
// the first value it cannot convert, and a deployment with three mistakes
// would take three restarts to fix. run reports them together with the
// command's own checks (flagProblems), one line each.
type valueNotes struct {
	problems flagProblems
	// env is the variable a flag's value is being read from while kong
	// converts what envResolver resolved (command-line values are
	// converted before any variable is resolved), so that a bad value
	// names where it came from.
	env map[*kong.Value]string
}

// lenientMappers wraps kong's own mapper of every scalar type the commands'
// flags have, so that a bad value is noted in notes instead of ending the
// parse.
func lenientMappers(notes *valueNotes) []kong.Option {
	defaults := kong.NewRegistry().RegisterDefaults()
	var opts []kong.Option
	for _, kind := range []reflect.Kind{reflect.Bool, reflect.Int, reflect.Int64, reflect.String} {
		opts = append(opts, kong.KindMapper(kind, lenient{base: defaults.ForType(kindType[kind]), notes: notes}))
	}
	duration := reflect.TypeOf(time.Duration(0))
	return append(opts, kong.TypeMapper(duration, lenient{base: defaults.ForType(duration), notes: notes}))
}

// kindType is a type of each kind lenientMappers wraps, to look up kong's
// mapper of that kind.
var kindType = map[reflect.Kind]reflect.Type{
	reflect.Bool: reflect.TypeOf(false), reflect.Int: reflect.TypeOf(0),
	reflect.Int64: reflect.TypeOf(int64(0)), reflect.String: reflect.TypeOf(""),
}

// lenient converts a flag's value with kong's mapper (base) and checks it
// against the flag's enum. A value that does not convert, or is not one of
// the enum's, is noted and the flag takes its default instead (its zero
// without one), so that parsing goes on and the checks after it see a
// valid value rather than complain about a zero. A flag with no value at
// all (--ttl at the end of the line, or followed by another flag) still
// fails at once, as do positional arguments and an enum without a default:
// nothing after them can be read with confidence, or nothing valid stands
// in.
type lenient struct {
	base  kong.Mapper
	notes *valueNotes
}

// IsBool keeps a wrapped bool flag a switch: --flag alone means true.
func (l lenient) IsBool() bool {
	b, ok := l.base.(kong.BoolMapper)
	return ok && b.IsBool()
}

func (l lenient) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	next := ctx.Scan.Peek()
	if ctx.Value.Flag == nil || !next.IsValue() || (l.IsBool() && next.Type != kong.FlagValueToken) {
		return l.base.Decode(ctx, target)
	}
	err := l.base.Decode(ctx, target)
	enum := ctx.Value.Enum != ""
	if err == nil && enum && !ctx.Value.EnumMap()[target.String()] {
		err = fmt.Errorf("must be one of %s but got %q", quoted(ctx.Value.EnumSlice()), target.String())
	}
	if err == nil {
		return nil
	}
	if enum && ctx.Value.Default == "" {
		return err // nothing valid to stand in: kong's own answer
	}
	l.notes.note(ctx.Value, fmt.Sprint(next.Value), err)
	if ctx.Value.Default == "" {
		target.SetZero() // what the flag is when it is not given
		return nil
	}
	def := kong.ScanFromTokens(kong.Token{Type: kong.FlagValueToken, Value: ctx.Value.Default})
	if err := l.base.Decode(ctx.WithScanner(def), target); err != nil {
		return fmt.Errorf("the default of %s: %w", ctx.Value.ShortSummary(), err)
	}
	return nil
}

// quoted is "a", "b", "c".
func quoted(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = strconv.Quote(w)
	}
	return strings.Join(q, ", ")
}

// note records that value, given for v, is bad: "--ttl: expected duration
// but got "x"", or "--ttl: IDEMPOTENCY_TTL="x": expected ..." when it came
// from the environment.
func (n *valueNotes) note(v *kong.Value, value string, err error) {
	if name, ok := n.env[v]; ok {
		n.problems.bad("%s: %s=%q: %v", v.ShortSummary(), name, value, err)
		return
	}
	n.problems.bad("%s: %v", v.ShortSummary(), err)
}

// flagChecker is a command that checks its flags' values together before
// it runs (serve, proxy): run adds what it finds to the bad values noted
// while parsing, so that one report has them all.
type flagChecker interface {
	checkFlags(getenv func(string) string) flagProblems
}

func (s *serveCmd) checkFlags(getenv func(string) string) flagProblems {
	_, err := s.config(getenv)
	return problemsOf(err)
}

func (p *proxyCmd) checkFlags(func(string) string) flagProblems {
	_, err := p.gatewayConfig()
	return problemsOf(err)
}

// problemsOf is the lines of a flagProblems error, or err as one line.
func problemsOf(err error) flagProblems {
	var problems flagProblems
	if errors.As(err, &problems) || err == nil {
		return problems
	}
	return flagProblems{err.Error()}
}
