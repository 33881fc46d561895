package client_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
)

// TestEveryOperationHasAMethod: each operation of openapi.yaml has a
// method of its own on Client, named after its operationId (createPayment
// is CreatePayment) and taking the call's context first, so that an
// operation added to the contract cannot be left to Idempotent by
// oversight.
func TestEveryOperationHasAMethod(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(oncekey.OpenAPISpec)
	require.NoError(t, err)
	sdk := reflect.TypeFor[*client.Client]()
	ctx := reflect.TypeFor[context.Context]()
	seen := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			seen++
			require.NotEmpty(t, op.OperationID, "%s %s has no operationId", method, path)
			name := strings.ToUpper(op.OperationID[:1]) + op.OperationID[1:]
			m, ok := sdk.MethodByName(name)
			require.True(t, ok, "%s %s (%s): the Go client has no method %s", method, path, op.OperationID, name)
			require.True(t, m.Type.NumIn() > 1 && m.Type.In(1) == ctx, "%s takes the context first", name)
		}
	}
	require.GreaterOrEqual(t, seen, 17, "every operation of openapi.yaml was read")
}

// TestPaymentAndBonusMethods: the methods of the payment and bonus
// operations act once under the faults the others are tested with, and
// the reads and the operations endpoints answer as the contract says.
func TestPaymentAndBonusMethods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The provider's latency keeps the payment pending while the SDK
	// retries: it returns the payment as accepted.
	b := setupPayments(t, provider.Faults{Latency: time.Second})
	order, err := b.client.CreateOrder(ctx, seedOrder)
	require.NoError(t, err)

	b.injector.then(dropAfterCommit)
	payment, err := b.client.CreatePayment(ctx, api.NewPayment{OrderId: order.Id, Amount: order.Amount, Currency: order.Currency})
	require.NoError(t, err)
	require.Equal(t, api.PaymentStatus(payments.StatusPending), payment.Status, "accepted, not waited for")
	require.Equal(t, order.Id, payment.OrderId)
	b.requireRanOnce(t, "POST /payments", 2)
	final := await(t, func() (*api.Payment, error) { return b.client.GetPayment(ctx, payment.Id) },
		func(p api.Payment) bool { return p.Status != api.PaymentStatus(payments.StatusPending) })
	require.Equal(t, api.PaymentStatus(payments.StatusSucceeded), final.Status)

	page, err := b.client.ListOrders(ctx, nil)
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	require.Equal(t, order.Id, page.Items[0].Id)
	require.Nil(t, page.NextCursor, "one page")

	b.injector.then(dropAfterCommit)
	credit, err := b.client.CreateBonusCredit(ctx, api.NewBonusEntry{Amount: 100, Reason: "welcome bonus"})
	require.NoError(t, err)
	require.EqualValues(t, 100, credit.Balance)
	require.EqualValues(t, 100, credit.Entry.Amount)
	b.requireRanOnce(t, "POST /bonus/credits", 2)
	debit, err := b.client.CreateBonusDebit(ctx, api.NewBonusEntry{Amount: 40, Reason: "order " + order.Id})
	require.NoError(t, err)
	require.EqualValues(t, 60, debit.Balance)
	require.Equal(t, api.BonusEntryKind("debit"), debit.Entry.Kind)
	_, err = b.client.CreateBonusDebit(ctx, api.NewBonusEntry{Amount: 1000, Reason: "more than the balance"})
	requireProblem(t, err, httpapi.ProblemFor(ledger.ErrInsufficientFunds))
	balance, err := b.client.GetBonusBalance(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 60, balance.Balance)

	health, err := b.client.GetHealth(ctx)
	require.NoError(t, err)
	require.Equal(t, "ok", health.Status)
	ready, err := b.client.GetReadiness(ctx)
	require.NoError(t, err)
	require.Equal(t, "ok", ready.Status)
	spec, err := b.client.GetSpec(ctx)
	require.NoError(t, err)
	require.Equal(t, oncekey.OpenAPISpec, spec)
	docs, err := b.client.GetDocs(ctx)
	require.NoError(t, err)
	require.Contains(t, string(docs), `<redoc spec-url="/openapi.yaml"`)
}
