package idempotency

// Unexported names that the package's external tests (package
// idempotency_test) reach.
var (
	ErrMalformedForm        = errMalformedForm
	ErrMalformedContentType = errMalformedContentType
	RecordID                = recordID
)
