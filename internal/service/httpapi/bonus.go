package httpapi

import (
	"context"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiserver"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/store"
)

func (h *handlers) CreateBonusCredit(ctx context.Context, req apiserver.CreateBonusCreditRequestObject) (apiserver.CreateBonusCreditResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	e, err := h.ledger.Credit(ctx, c.unit, c.account, req.Body.Amount, req.Body.Reason)
	if err != nil {
		return nil, err
	}
	return apiserver.CreateBonusCredit201JSONResponse{BonusEntryCreatedJSONResponse: apiserver.BonusEntryCreatedJSONResponse{Body: toAPIEntryResult(e)}}, nil
}

func (h *handlers) CreateBonusDebit(ctx context.Context, req apiserver.CreateBonusDebitRequestObject) (apiserver.CreateBonusDebitResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	e, err := h.ledger.Debit(ctx, c.unit, c.account, req.Body.Amount, req.Body.Reason)
	if err != nil {
		return nil, err
	}
	return apiserver.CreateBonusDebit201JSONResponse{BonusEntryCreatedJSONResponse: apiserver.BonusEntryCreatedJSONResponse{Body: toAPIEntryResult(e)}}, nil
}

func (h *handlers) GetBonusBalance(ctx context.Context, req apiserver.GetBonusBalanceRequestObject) (apiserver.GetBonusBalanceResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	balance, err := h.ledger.Balance(consistent(ctx, req.Params.Consistency), acct)
	if err != nil {
		return nil, err
	}
	return apiserver.GetBonusBalance200JSONResponse{Balance: balance}, nil
}

func toAPIEntryResult(e ledger.Entry) api.BonusEntryResult {
	return api.BonusEntryResult{
		Balance: e.BalanceAfter,
		Entry: api.BonusEntry{
			Id:           e.ID.String(),
			Kind:         api.BonusEntryKind(e.Kind),
			Amount:       e.Amount,
			Reason:       e.Reason,
			BalanceAfter: e.BalanceAfter,
			CreatedAt:    e.CreatedAt,
		},
	}
}
