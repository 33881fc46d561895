// Package bearer reads the token of an "Authorization: Bearer <token>"
// header. It is shared: the service authenticates callers with it, and the
// gateway scopes their keys with it, and neither product may import the
// other's packages.
package bearer

import "strings"

// Token extracts the token of an "Authorization: Bearer <token>" header
// value (the scheme is case-insensitive, RFC 9110 §11.1).
func Token(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
