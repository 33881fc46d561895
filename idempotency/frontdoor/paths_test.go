package frontdoor_test

import (
	"net/url"
	"testing"

	"github.com/oncekey/oncekey/idempotency/frontdoor"
)

// TestAmbiguousPath: the request targets that upstreams read in different
// ways, and some that they all read alike.
func TestAmbiguousPath(t *testing.T) {
	t.Parallel()
	for target, ambiguous := range map[string]bool{
		"/transfers": false, "/transfers/": false, "/": false, "/Transfers": false, "/%74ransfers": false,
		"/transfers/1?x=/../": false, "/a%20b": false, "/a.b/c..d/.e": false,
		"/./transfers": true, "/transfers/.": true, "/x/../transfers": true, "/transfers/..": true,
		"//transfers": true, "/a//b": true, "/transfers//": true,
		"/%2e/transfers": true, "/%2E%2E/transfers": true, "/x%2f..%2ftransfers": true, "/trans%2Ffers": true,
		`/x\..\transfers`: true, "/x%5ctransfers": true, "/transfers;jsessionid=1": true, "/transfers%3b": true,
		"/transfers%00": true, "/transfers%7f": true,
	} {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		if why := frontdoor.AmbiguousPath(u); (why != "") != ambiguous {
			t.Errorf("AmbiguousPath(%q) = %q, want ambiguous %v", target, why, ambiguous)
		}
	}
}
