package pgstore

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekey/oncekey/idempotency"
)

// How a response is kept in its key row, written by encodeResponse and
// read by decodeResponse alone, so that every statement that stores a
// response and every path that reads one agree.
//
// A response whose body is in its record is kept as it is: its status,
// its headers as JSON, its body. A response whose body is in pieces
// (Response.Pieces > 0, stored apart by WritePiece) is kept so that a
// release that knows nothing of pieces, running on the same table after a
// rollback, reads it as what it is to that release: an operation that
// ran and whose response it cannot replay. Its response_status is
// idempotency.StatusHeld and its response_body a held record of state
// idempotency.HeldNotStored, which such a release answers with a 409
// saying so (idempotency.ErrNotStored), never with the record's empty
// body as a 200. The real status is a member of that document of its own
// ("status", which idempotency.Held does not have and ignores); the
// headers are the real ones; response_pieces and response_size count the
// pieces. A row is read as a response in pieces only when its
// response_status is StatusHeld and response_pieces is above zero: every
// statement that takes a record of status 102 for a held one also asks
// that response_pieces be NULL (see internal/keydb), and a row that a
// release that knows no pieces rewrote (an operator's resolve, with a
// status of its own) is read as the response in its record that it now
// is, its stale count ignored.

// inPieces is the response_body of a record whose body is in pieces: a
// held record, not stored, to a release that knows no pieces (State and
// Reason are idempotency.Held's), and the real status to this one.
type inPieces struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
	Status int    `json:"status"`
}

// inPiecesReason is inPieces.Reason, for the people who read a previous
// release's 409 or its operator's view of the key.
const inPiecesReason = "the response (status %d, %d bytes) is stored in pieces, which this release cannot replay: a release that stores bodies in pieces replays it"

// encodeResponse returns a response as the key row stores it: its
// response_status, response_headers and response_body (a response in
// pieces as inPieces, see above; response_pieces and response_size are
// its Pieces and Size, NULL for a body in its record).
func encodeResponse(resp idempotency.Response) (status int32, headers, body []byte, err error) {
	headers, err = json.Marshal(resp.Header)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("encode headers: %w", err)
	}
	if resp.Pieces > 0 {
		switch {
		case resp.Pieces > math.MaxInt32:
			return 0, nil, nil, fmt.Errorf("pgstore: a body in %d pieces, more than the key table counts", resp.Pieces)
		case resp.Status < 100 || resp.Status > 999 || resp.Status == idempotency.StatusHeld:
			return 0, nil, nil, fmt.Errorf("pgstore: a response in pieces of status %d, not an operation's outcome", resp.Status)
		}
		body, err = json.Marshal(inPieces{
			State:  idempotency.HeldNotStored,
			Reason: fmt.Sprintf(inPiecesReason, resp.Status, resp.Size),
			Status: resp.Status,
		})
		if err != nil {
			return 0, nil, nil, fmt.Errorf("encode a response in pieces: %w", err)
		}
		return idempotency.StatusHeld, headers, body, nil
	}
	body = resp.Body
	if body == nil {
		// pgx sends a nil []byte as NULL, which the completed-row CHECK
		// rejects; a response without a body (204, or a handler that wrote
		// nothing) is stored as empty bytes.
		body = []byte{}
	}
	return int32(resp.Status), headers, body, nil
}

// decodeResponse reads a response from its key row's columns, as
// encodeResponse stored it: a row of status 102 with response_pieces
// above zero is a response in pieces, of the status its body names, with
// no body.
func decodeResponse(status pgtype.Int4, headers, body []byte, pieces pgtype.Int4, size pgtype.Int8) (idempotency.Response, error) {
	resp := idempotency.Response{Status: int(status.Int32), Body: body, Header: http.Header{}}
	if resp.Status == idempotency.StatusHeld && pieces.Valid && pieces.Int32 > 0 {
		var p inPieces
		if err := json.Unmarshal(body, &p); err != nil || p.Status == 0 {
			return idempotency.Response{}, fmt.Errorf("decode a stored response in pieces: no status in %q (%v)", body, err)
		}
		resp.Status, resp.Body, resp.Pieces, resp.Size = p.Status, nil, int(pieces.Int32), size.Int64
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &resp.Header); err != nil {
			return idempotency.Response{}, fmt.Errorf("decode stored headers: %w", err)
		}
	}
	return resp, nil
}

// newRecord builds a completed record from its stored columns (see
// decodeResponse), read at readAt by the database's clock (a held
// record's lease is on it).
func newRecord(fingerprint []byte, status pgtype.Int4, headers, body []byte, pieces pgtype.Int4, size pgtype.Int8, createdAt, expiresAt, readAt time.Time) (*idempotency.Record, error) {
	rec := &idempotency.Record{CreatedAt: createdAt, ExpiresAt: expiresAt, ReadAt: readAt}
	if len(fingerprint) != len(rec.Fingerprint) {
		return nil, fmt.Errorf("stored fingerprint has %d bytes", len(fingerprint))
	}
	copy(rec.Fingerprint[:], fingerprint)
	resp, err := decodeResponse(status, headers, body, pieces, size)
	if err != nil {
		return nil, err
	}
	rec.Response = resp
	return rec, nil
}
