package gateway

import (
	"errors"
	"net/http"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// frontDoor is a covered route's handler: it reads the key where the
// route's clients put it (a header, or a member of the JSON body), the
// scope and the body, and runs the operation (named name) with them,
// forwarding the request upstream as it came.
func frontDoor[U any](e *idempotency.Engine, op *idempotency.Operation[U], name string, rt *route, cfg Config, scope func(*http.Request) (string, error), fwd http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.PreviousScopes != nil {
			r = withPrevious(r, cfg.Namespace, cfg.PreviousScopes)
		}
		in, err := rt.Key.Prepare(w, r, scope, cfg.MaxBodyBytes)
		if err != nil {
			if cfg.Observer != nil {
				cfg.Observer.Outcome(name, idempotency.OutcomeRejected)
			}
			e.WriteError(w, r, err)
			return
		}
		op.Serve(w, r, in, fwd)
	})
}

// answers writes the answers the gateway gives itself: in the profile and
// the error shape of the route the request matched, else the gateway's.
type answers struct {
	profile  frontdoor.Profile
	template *frontdoor.Template
}

// of is the answers of r's route.
func (a answers) of(r *http.Request) answers {
	if rt, ok := r.Context().Value(routeKey{}).(*route); ok {
		return answers{profile: rt.Profile, template: rt.ErrorTemplate}
	}
	return a
}

// write answers with err: the gateway's own errors, else the protocol's.
func (a answers) write(w http.ResponseWriter, r *http.Request, err error) {
	var invalid *invalidError
	switch {
	case errors.Is(err, errUnreachable):
		a.kind(w, r, Unreachable, err.Error())
	case errors.As(err, &invalid):
		a.kind(w, r, problem.Validation, invalid.detail)
	default:
		a = a.of(r)
		frontdoor.Write(w, a.template, frontdoor.AnswerFor(a.profile, problem.TypeBase, err))
	}
}

// kind answers with a problem of the gateway's own.
func (a answers) kind(w http.ResponseWriter, r *http.Request, k problem.Kind, detail string) {
	frontdoor.Write(w, a.of(r).template, frontdoor.Answer{Status: k.Status, Type: k.Type(), Code: k.Slug, Title: k.Title, Detail: detail})
}
