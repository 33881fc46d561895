package client_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/client/internal/released"
	"github.com/oncekey/oncekey/gen/api"
)

// The statuses of orders, payments and refunds are open enums (x-open-enum
// in openapi.yaml): a release may add a value, and the breaking-change gate
// lets it, on the promise that an SDK generated before it reads the new
// value without an error. These tests keep that promise the way it is
// broken in practice: an old SDK against a newer server.
//
// The old SDK is built from two contracts. The released one
// (api/openapi.released.yaml, 0.1.0, generated into client/internal/released)
// is what users run today, but it has orders alone, with the closed
// status enum [created], so with it only an order can be read. openapi.yaml
// is the previous release once the next one ships, and has orders, payments
// and refunds: the SDK as it is (client over gen/) reads all three. The
// newer server is one whose contract is openapi.yaml with newStatus added
// to every open enum (laterContract); its answers are newStatusFile, and
// every answer an SDK reads here is checked against that contract as it
// arrives.

// TestNewStatusAnswers: the answers the SDKs are given are what a server
// of the later contract may send, and what no server of openapi.yaml
// sends, so reading them tests a value the SDKs do not know.
func TestNewStatusAnswers(t *testing.T) {
	t.Parallel()
	answers := newStatusAnswers(t)
	for _, tc := range []struct {
		name       string
		contract   func(*testing.T) *openapi3.T
		violations int
	}{
		{name: "the later contract", contract: laterContract, violations: 0},
		{name: "openapi.yaml", contract: func(t *testing.T) *openapi3.T { _, doc := loadContract(t); return doc }, violations: len(answers)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server := newStatusServer(t)
			httpClient, transport := validatingClient(t, tc.contract(t), server.URL)
			for name, a := range answers {
				resp, err := httpClient.Get(server.URL + a.path)
				require.NoError(t, err, "GET the %s", name)
				require.NoError(t, resp.Body.Close())
				require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s", a.path)
			}
			require.Equal(t, len(answers), transport.Checked(), "every answer was checked against %s", tc.name)
			violations := transport.Violations()
			require.Len(t, violations, tc.violations, "answers that violate %s: %v", tc.name, violations)
			for _, v := range violations {
				require.ErrorContains(t, v, `Error at "/status"`, "an answer violates %s by its status alone", tc.name)
				require.ErrorContains(t, v, `"`+newStatus+`"`, "an answer violates %s by its status alone", tc.name)
			}
		})
	}
}

// TestReleasedClientReadsNewStatus: the Go SDK as the released contract
// generated it reads an order in a status it has no constant for. The
// released contract has no payments or refunds to read.
func TestReleasedClientReadsNewStatus(t *testing.T) {
	t.Parallel()
	releasedDoc, err := os.ReadFile("../api/openapi.released.yaml")
	require.NoError(t, err, "the released contract")
	paths, err := openapi3.NewLoader().LoadFromData(releasedDoc)
	require.NoError(t, err, "load the released contract")
	require.Nil(t, paths.Paths.Find("/payments/{id}"),
		"the released contract has payments now: read a payment and a refund with its client here too")

	answers := newStatusAnswers(t)
	server := newStatusServer(t)
	httpClient, transport := validatingClient(t, laterContract(t), server.URL)
	c, err := released.NewClientWithResponses(server.URL, released.WithHTTPClient(httpClient))
	require.NoError(t, err, "the released client")

	resp, err := c.GetOrderWithResponse(t.Context(), answers["order"].id)
	require.NoError(t, err, "an order in a status the released client does not know")
	require.Equal(t, http.StatusOK, resp.StatusCode(), "GET the order: %s", resp.Body)
	require.NotNil(t, resp.JSON200, "the order is decoded")
	order := resp.JSON200
	require.Equal(t, released.OrderStatus(newStatus), order.Status, "the status as the server sent it")
	require.False(t, order.Status.Valid(), "Valid tells a status the released client does not know")
	switch order.Status {
	case released.Created:
		t.Fatalf("a status the released client knows: %s", order.Status)
	default: // what a caller does with a status it does not know
	}
	require.Equal(t, 1, transport.Checked(), "the answer was checked against the later contract")
	require.Empty(t, transport.Violations(), "the answer is one a server of the later contract may send")
}

// TestUnknownStatusesDecode: the Go SDK as it is (client, over the models
// generated from openapi.yaml) reads an order, a payment and a refund in a
// status it does not know: decoded as it came, for the caller to branch on
// (Valid is false, a switch takes its default), never a decode error.
func TestUnknownStatusesDecode(t *testing.T) {
	t.Parallel()
	answers := newStatusAnswers(t)
	server := newStatusServer(t)
	httpClient, transport := validatingClient(t, laterContract(t), server.URL)
	c, err := client.New(client.Config{BaseURL: server.URL, APIKey: "ok_test", HTTPClient: httpClient})
	require.NoError(t, err, "the client")

	order, err := c.GetOrder(t.Context(), answers["order"].id)
	require.NoError(t, err, "an order in a status this client does not know")
	require.Equal(t, api.OrderStatus(newStatus), order.Status)
	require.False(t, order.Status.Valid(), "Valid tells a status this client does not know")
	switch order.Status {
	case api.Created, api.Cancelled:
		t.Fatalf("a known status: %s", order.Status)
	default: // what a caller does with a status it does not know
	}

	payment, err := c.GetPayment(t.Context(), answers["payment"].id)
	require.NoError(t, err, "a payment in a status this client does not know")
	require.Equal(t, api.PaymentStatus(newStatus), payment.Status)
	require.False(t, payment.Status.Valid(), "Valid tells a status this client does not know")
	switch payment.Status {
	case api.PaymentStatusPending, api.PaymentStatusSucceeded, api.PaymentStatusFailed:
		t.Fatalf("a known status: %s", payment.Status)
	default:
	}

	refund, err := c.GetRefund(t.Context(), answers["refund"].id)
	require.NoError(t, err, "a refund in a status this client does not know")
	require.Equal(t, api.RefundStatus(newStatus), refund.Status)
	require.False(t, refund.Status.Valid(), "Valid tells a status this client does not know")
	switch refund.Status {
	case api.RefundStatusPending, api.RefundStatusSucceeded, api.RefundStatusFailed:
		t.Fatalf("a known status: %s", refund.Status)
	default:
	}

	require.Equal(t, len(answers), transport.Checked(), "every answer was checked against the later contract")
	require.Empty(t, transport.Violations(), "the answers are ones a server of the later contract may send")
}
