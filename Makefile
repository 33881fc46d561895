# Oncekey. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: run
run: ## serve the API (in memory unless DATABASE_URL is set; honours ONCEKEY_ADDR etc.)
	$(GO) run ./cmd/oncekey serve

.PHONY: build
build: ## build bin/oncekey
	$(GO) build -o bin/oncekey ./cmd/oncekey

.PHONY: generate
generate: ## regenerate gen/api (oapi-codegen) and gen/db (sqlc) from openapi.yaml, schema/ and queries/
	$(GO) generate ./...

.PHONY: verify
verify: generate/check lint api/breaking ## fail if generated code is stale, the contract breaks clients, or the code is not vetted, formatted and tidy

.PHONY: generate/check
generate/check: generate ## regenerate and fail on any difference from what is committed
	@if [ -n "$$(git status --porcelain -- gen/)" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; git status --porcelain -- gen/; git diff --stat -- gen/; exit 1; fi
	@echo "generated code is fresh"

OASDIFF := $(GO) tool -modfile=tools/go.mod oasdiff

.PHONY: api/breaking
api/breaking: ## fail on breaking changes of openapi.yaml against the released contract (api/openapi.released.yaml)
	$(OASDIFF) breaking api/openapi.released.yaml openapi.yaml --fail-on ERR --err-ignore api/breaking-changes.allowed --format singleline
	@# The gate must catch a breaking change: removing an operation has to fail it.
	@tmp=$$(mktemp --suffix=.yaml); trap 'rm -f $$tmp' EXIT; \
	  sed '/^  \/orders\/{id}:/,/^  \/healthz:/{/^  \/healthz:/!d}' openapi.yaml > $$tmp; \
	  if $(OASDIFF) breaking api/openapi.released.yaml $$tmp --fail-on ERR >/dev/null 2>&1; then \
	    echo "api/breaking: the gate did not flag a removed operation"; exit 1; fi
	@echo "openapi.yaml is compatible with the released contract"

.PHONY: api/release
api/release: ## record openapi.yaml as the released contract (run when cutting a release)
	cp openapi.yaml api/openapi.released.yaml

.PHONY: lint
lint: ## go vet, gofmt and a tidy go.mod
	$(GO) vet ./...
	$(GO) mod tidy -diff
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: test
test: ## run the whole test suite with the race detector (needs PostgreSQL at 127.0.0.1:5432)
	$(GO) test -race -count=1 -timeout 15m ./...

.PHONY: fuzz
fuzz: ## run the fuzz targets for a while each (FUZZTIME=30s)
	$(GO) test -run='^$$' -fuzz=FuzzCanonicalize -fuzztime=$(or $(FUZZTIME),30s) ./internal/canonjson/
	$(GO) test -run='^$$' -fuzz=FuzzDifferentMeaning -fuzztime=$(or $(FUZZTIME),30s) ./internal/canonjson/
