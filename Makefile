# Oncekey. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
# GO_PATCH is the toolchain every target builds with: the patch release
# govulncheck finds clean (go.mod's toolchain line says the same). The go
# command fetches it through the module proxy on first use. Where it cannot
# (no proxy, offline), the targets build with the installed Go, which must
# meet go.mod's go line, and say so in one line; GOTOOLCHAIN, when set,
# decides instead (GOTOOLCHAIN=local make … always uses the installed Go).
GO_PATCH := go1.26.10
ifeq ($(origin GOTOOLCHAIN),undefined)
  ifeq ($(shell GOTOOLCHAIN=$(GO_PATCH) $(GO) version >/dev/null 2>&1 && echo ok),ok)
    export GOTOOLCHAIN := $(GO_PATCH)
  else
    export GOTOOLCHAIN := local
    $(info make: $(GO_PATCH) cannot be fetched (no module proxy?): building with the installed $(shell GOTOOLCHAIN=local $(GO) env GOVERSION); make vulncheck wants $(GO_PATCH))
  endif
endif

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: go-version
go-version: ## print the Go toolchain the targets build with
	@$(GO) version

.PHONY: run
run: ## serve the API on 127.0.0.1:8080 with the demo key ok_local_demo (in memory unless DATABASE_URL is set; honours every ONCEKEY_* variable); Ctrl-C stops it
	@echo "make run: building bin/oncekey (about 30 s the first time, a second or two after that)"
	@$(GO) build -buildvcs=auto -o bin/oncekey ./cmd/oncekey
	@# Not go run: Ctrl-C then ends serve cleanly instead of failing make.
	@echo "make run: starting bin/oncekey serve"
	@bin/oncekey serve

.PHONY: build
build: ## build bin/oncekey and bin/fakeprovider (the sandbox payment provider)
	$(GO) build -buildvcs=auto -o bin/oncekey ./cmd/oncekey
	$(GO) build -buildvcs=auto -o bin/fakeprovider ./cmd/fakeprovider

# IMAGE is the tag make image builds; IMAGE_VERSION its
# org.opencontainers.image.version label. deploy/container/engine.sh runs
# podman or docker, whichever works, with the flags this kind of machine
# needs (it says which, and why).
IMAGE         ?= localhost/oncekey:dev
IMAGE_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: image
image: ## build the container image IMAGE (localhost/oncekey:dev) with podman or docker, whichever works: FROM scratch (nothing pulled), the static stripped binary, this machine's CA bundle, user 65532; entrypoint oncekey, so IMAGE serve and IMAGE proxy take its flags (docs/operations.md)
	@set -e; ctx=$$(mktemp -d); trap 'rm -rf $$ctx' EXIT; \
	  CGO_ENABLED=0 $(GO) build -buildvcs=auto -trimpath -ldflags='-s -w' -o $$ctx/oncekey ./cmd/oncekey; \
	  cp /etc/ssl/certs/ca-certificates.crt deploy/container/passwd deploy/container/group $$ctx/; \
	  deploy/container/engine.sh build --quiet --build-arg VERSION=$(IMAGE_VERSION) -f deploy/container/Containerfile -t $(IMAGE) $$ctx >/dev/null; \
	  echo "$(IMAGE): $$(deploy/container/engine.sh image inspect --format '{{.Size}}' $(IMAGE)) bytes, its binary $$(stat -c %s $$ctx/oncekey)"

.PHONY: test/image
test/image: ## build the image (make image, under a tag of its own) and hold it: user 65532, the CA bundle, at most the stripped static binary plus 2 MB; serve in it on a fresh PostgreSQL database until /readyz answers; proxy in it replaying a POST its upstream ran once (podman or docker; required when CI is set)
	@if ! why=$$(deploy/container/engine.sh --which 2>&1 >/dev/null) && [ -z "$$CI" ]; then \
	  echo "make test: skipped test/image, the container image's test: $${why#engine.sh: }"; exit 0; fi; \
	set -x; $(GO) vet -tags image ./deploy/container && \
	  $(GO) test -tags image -count=1 -timeout 10m -v -run '^TestImage$$' ./deploy/container

.PHONY: generate
generate: proto ## regenerate gen/api, gen/apiserver and gen/apiclient (oapi-codegen) and gen/db (sqlc) from openapi.yaml, schema/ and queries/, client/internal/released (the Go SDK as the released contract api/openapi.released.yaml generates it, for the tests), and the gRPC tests' and example's Go code from their .proto files
	$(GO) generate ./...

# PROTOS are the .proto files of the gRPC adapter's tests and of its
# example, each compiled beside itself by protoc (Debian's
# protobuf-compiler) with the Go plugins at these versions.
PROTOS := idempotency/integration/grpcidem/testpb/ledger.proto examples/transfers/transferspb/transfers.proto
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

.PHONY: proto
proto: ## compile PROTOS with protoc and the pinned protoc-gen-go and protoc-gen-go-grpc (needs protoc: apt-get install protobuf-compiler)
	@command -v protoc >/dev/null 2>&1 || { echo "protoc is required: apt-get install protobuf-compiler"; exit 1; }
	@set -e; bin=$$(mktemp -d); trap 'rm -rf $$bin' EXIT; \
	  GOBIN=$$bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION); \
	  GOBIN=$$bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION); \
	  for p in $(PROTOS); do \
	    (cd $$(dirname $$p) && PATH=$$bin:$$PATH protoc --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. $$(basename $$p)); \
	  done

.PHONY: verify
verify: generate/check verify/example sdk/check docs/check docs/images/check lint lint/spec api/breaking api/go vulncheck ## fail if anything generated or vendored or a picture in docs/img is stale, the contract or an engine module's Go API breaks its users, the spec fails its linter, or the code is not vetted, formatted and tidy

.PHONY: sdk
sdk: generate ## regenerate both SDKs: the Go client (gen/api, gen/apiclient, and client/internal/released from the released contract) and the TypeScript types (sdk/typescript/src/schema.d.ts)
	cd sdk/typescript && npm ci --no-audit --no-fund --silent && npm run --silent generate

.PHONY: sdk/check
sdk/check: sdk ## regenerate the SDKs and fail on any difference from what is committed
	@if [ -n "$$(git status --porcelain -- gen/ client/internal/released/ sdk/typescript/src/)" ]; then \
		echo "an SDK is stale; run 'make sdk' and commit:"; git status --porcelain -- gen/ client/internal/released/ sdk/typescript/src/; exit 1; fi
	@echo "SDKs are fresh"

.PHONY: docs/assets
docs/assets: ## vendor the pinned Redoc bundle that GET /docs serves
	internal/service/docspage/vendor.sh

.PHONY: docs/check
docs/check: docs/assets ## re-vendor the /docs assets and fail if the committed ones differ
	@if [ -n "$$(git status --porcelain -- internal/service/docspage/assets/)" ]; then \
		echo "vendored docs assets differ from the pinned version:"; git status --porcelain -- internal/service/docspage/assets/; exit 1; fi

.PHONY: lint/spec
lint/spec: ## lint openapi.yaml with @redocly/cli (config: api/redocly.yaml)
	cd tools/node && npm ci --no-audit --no-fund --silent && npm run --silent lint:spec

# GENERATED is every directory of generated code: the service's, pgstore's
# queries, which are internal to it, the released contract's Go client,
# which the client's tests read a later server's answers with, and the Go
# code of PROTOS.
GENERATED := gen/ idempotency/pgstore/internal/keydb/ client/internal/released/ $(dir $(PROTOS))

.PHONY: generate/check
generate/check: generate ## regenerate and fail on any difference from what is committed
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; git status --porcelain -- $(GENERATED); git diff --stat -- $(GENERATED); exit 1; fi
	@echo "generated code is fresh"

OASDIFF := $(GO) tool -modfile=tools/go.mod oasdiff

.PHONY: api/breaking
api/breaking: ## fail on breaking changes of openapi.yaml against the released contract (api/openapi.released.yaml); open enums (x-open-enum) may gain values
	GO="$(GO)" tools/api-breaking.sh

.PHONY: api/release
api/release: api/go/release ## record openapi.yaml and the engine's Go API as released (run when cutting a release), regenerate the released contract's Go client (client/internal/released), record the commit as the previous release (api/previous-release) and clear the migrations' exceptions (api/migrations.allowed)
	cp openapi.yaml api/openapi.released.yaml
	@# The commit this runs at is the release that the next one's migrations
	@# must leave runnable (docs/operations.md, "Upgrades and rollbacks"); its
	@# migrations are released, and their exceptions with them.
	{ grep '^#' api/previous-release; git rev-parse HEAD; } > api/previous-release.new && mv api/previous-release.new api/previous-release
	grep '^#' api/migrations.allowed > api/migrations.allowed.new && mv api/migrations.allowed.new api/migrations.allowed
	$(GO) tool oapi-codegen -config client/internal/released/oapi-codegen.yaml api/openapi.released.yaml

# The engine's public modules, whose exported Go API is a promise: each one's
# released API is kept as apidiff's export data in api/go/<module>.export.
PUBLIC_MODULES  := idempotency idempotency/pgstore idempotency/redisstore idempotency/oapi idempotency/grpcidem idempotency/caddymodule
APIDIFF_VERSION := v0.0.0-20261120182113-8801fbdfac81
APIDIFF         := $(GO) run golang.org/x/exp/cmd/apidiff@$(APIDIFF_VERSION)

.PHONY: api/go
api/go: ## fail on an incompatible change to an engine module's exported Go API against its released API (api/go/*.export) that api/go/breaking-changes.allowed does not declare
	@set -e; root=$$PWD; fail=0; for m in $(PUBLIC_MODULES); do \
	  base=$$root/api/go/$$(echo $$m | tr / -).export; \
	  report=$$(cd $$m && $(APIDIFF) -m -incompatible $$base github.com/oncekey/oncekey/$$m 2>/dev/null); \
	  found=$$(echo "$$report" | grep . | sed "s|^|$$m: |" | grep -vxF -f <(grep -v '^#' $$root/api/go/breaking-changes.allowed | grep . || true) || true); \
	  if [ -n "$$found" ]; then echo "api/go: incompatible changes not declared in api/go/breaking-changes.allowed:"; echo "$$found"; fail=1; fi; \
	done; [ $$fail = 0 ]
	@# The gate must catch a breaking change: against a released API that had
	@# one more exported function, the module as it is must be found to have
	@# removed it.
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	  (cd idempotency && git ls-files -co --exclude-standard . | grep -Ev '^(pgstore|redisstore|oapi|grpcidem|integration|caddymodule)/' | tar -cf - -T -) | tar -xf - -C $$tmp; \
	  printf 'package idempotency\n\n// GateProbe stands for a function the module removed.\nfunc GateProbe() {}\n' > $$tmp/gate_probe.go; \
	  (cd $$tmp && $(APIDIFF) -m -w $$tmp/probe.export github.com/oncekey/oncekey/idempotency 2>/dev/null); \
	  if ! (cd idempotency && $(APIDIFF) -m -incompatible $$tmp/probe.export github.com/oncekey/oncekey/idempotency 2>/dev/null) | grep -qx -- '- GateProbe: removed'; then \
	    echo "api/go: the gate did not flag a removed exported function"; exit 1; fi
	@echo "the engine's modules are compatible with their released APIs"

.PHONY: release
release: ## cut release VERSION (make release VERSION=v0.1.0) in the local repository: check the tree and that no tag exists, make api/go, make api/release, each public module's CHANGELOG section Unreleased named VERSION, the modules' requirements of each other at VERSION, one commit, and a tag per module (idempotency/pgstore/v0.1.0); DRY_RUN=1 prints what it would do and changes nothing; pushes nothing (tools/release.sh)
	@MAKE="$(MAKE)" GO="$(GO)" MODULES="$(PUBLIC_MODULES)" tools/release.sh "$(VERSION)"

.PHONY: api/go/release
api/go/release: ## record each engine module's exported Go API as released (api/go/*.export)
	@set -e; root=$$PWD; for m in $(PUBLIC_MODULES); do \
	  (cd $$m && $(APIDIFF) -m -w $$root/api/go/$$(echo $$m | tr / -).export github.com/oncekey/oncekey/$$m 2>/dev/null); done

# govulncheck's database is normally fetched from its own web service; here
# the same data comes through the Go module proxy (golang.org/x/vulndb, its
# source repository, pinned by date) and is indexed into a local database,
# once per run, which every module's scan reads.
VULNDB_VERSION      := v0.0.0-20261105234957-e22db6528018
GOVULNCHECK_VERSION := v1.9.0
# VULNCHECK_MODULES are every module the project publishes or tests: the
# service's, the engine's (idempotency/integration among them), the Caddy
# module, the examples, the tools the targets run (tools: sqlc and oasdiff,
# scanned as the packages its tool lines name, and its own packages, the
# bench and the dashboard snapshot) and the SDKs' tests
# (tools/sdks). Each is scanned with its tests, so what only a test
# imports counts too.
VULNCHECK_MODULES = . $(ENGINE_MODULES) $(CADDY_MODULE) examples/widgets examples/transfers tools tools/sdks

.PHONY: vulncheck
vulncheck: ## govulncheck on every package and test of every module in VULNCHECK_MODULES (the service, the engine's modules, caddymodule, the examples, tools), each module's advisories failing it whether their code is called or not, against the vulnerability database of VULNDB_VERSION; about 3 minutes once the modules are downloaded
	@set -e; db=$$(mktemp -d); trap 'rm -rf $$db' EXIT; start=$$SECONDS; \
	  src=$$(cd $$db && GOFLAGS= $(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	  test -d "$$src/data/osv" || { echo "vulncheck: no OSV data in golang.org/x/vulndb@$(VULNDB_VERSION)"; exit 1; }; \
	  (cd $$db && $(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns "$$src/data/osv" -out $$db/db); \
	  GOBIN=$$db/bin $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION); \
	  failed=(); for m in $(VULNCHECK_MODULES); do \
	    pkgs=./...; [ $$m != tools ] || pkgs="tool ./..."; t=$$SECONDS; \
	    (cd $$m && $$db/bin/govulncheck -db file://$$db/db -test -format json $$pkgs) > $$db/findings.json; \
	    if grep -q '"finding"' $$db/findings.json; then \
	      echo "vulncheck: $$m: advisories in modules it requires, called or not; bump them:"; \
	      (cd $$m && $$db/bin/govulncheck -db file://$$db/db -test -show verbose $$pkgs) | grep -E '^(Vulnerability #|    Found in|    Fixed in)' || true; \
	      failed+=("$$m"); \
	    else echo "vulncheck: $$m: no known vulnerability ($$((SECONDS-t))s)"; fi; \
	  done; \
	  [ $${#failed[@]} = 0 ] || { echo "vulncheck: advisories in $${failed[*]}"; exit 1; }; \
	  echo "vulncheck: $(words $(VULNCHECK_MODULES)) modules clean in $$((SECONDS-start))s"

# ENGINE_MODULES are the engine's modules (idempotency/integration holds
# tests only and is never published); the service's module replaces the
# others with these directories.
ENGINE_MODULES := idempotency idempotency/pgstore idempotency/redisstore idempotency/oapi idempotency/grpcidem idempotency/integration
# CADDY_MODULE is the engine as a Caddy handler: a module of its own, since
# Caddy brings some 600 modules that no other user of the engine should
# inherit.
CADDY_MODULE := idempotency/caddymodule

.PHONY: lint
lint: ## go vet, gofmt and a tidy go.mod, in the service's module, in each of the engine's, and in tools (the bench, the dashboard snapshot and the pictures of the mechanism)
	$(GO) vet ./...
	$(GO) vet -tags image ./deploy/container
	$(GO) mod tidy -diff
	@set -e; for m in $(ENGINE_MODULES) $(CADDY_MODULE) tools; do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(GO) mod tidy -diff); done
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# TEST_PG_CONNECTIONS is the most PostgreSQL connections make test holds at
# once, on any machine (24 measured at its peak, polling pg_stat_activity;
# 85 before it had a ceiling). go test's defaults grow with the cores (-p
# test binaries at a time, -parallel tests at a time in each), so they are
# fixed here at TEST_P and TEST_PARALLEL, and the pools the tests open are
# small: testdb.PoolSize (6) for the service's tests, 4 for each serve
# they start, pgstoretest's 10 for the engine's. Raising TEST_P or
# TEST_PARALLEL may need more. The preflight (internal/testsupport/testdb/testenv) fails
# at once, naming the number, when PostgreSQL has fewer free.
TEST_PG_CONNECTIONS := 40
TEST_P        := 2
TEST_PARALLEL := 2
# GOTEST runs go test through gotestsum (a tool of tools/go.mod), which
# prints a line per package as each one ends, whatever the order, and the
# output of every failed test again at the end: go test alone prints
# packages in order, so one long package hid every other for minutes.
GOTESTSUM     := $(CURDIR)/bin/gotestsum
GOTEST        := $(GOTESTSUM) --format pkgname --format-icons text --format-hide-empty-pkg -- -count=1 -p $(TEST_P) -parallel $(TEST_PARALLEL)

$(GOTESTSUM): tools/go.mod tools/go.sum
	$(GO) -C tools build -o $(GOTESTSUM) gotest.tools/gotestsum

# TEST_STEPS are make test's steps. Each runs even when one before it
# failed; make test then names every failure at the end.
TEST_STEPS := test/service test/engine test/caddy test/example test/alerts test/sdk test/image

.PHONY: test
test: ## run the whole test suite with the race detector: the service's, the engine's modules', the example services', the alert rule tests, the TypeScript SDK's (all but its live tests) and the container image's (make test/image), each step even when one before it failed, then every failure in a summary and every step skipped (needs PostgreSQL on 127.0.0.1:5432 with trust auth, Redis on 127.0.0.1:6379, and the programs test/preflight names: curl, python3, redis-server and redis-cli; npm, promtool and podman for a step each); DATABASE_URL and REDIS_URL point it elsewhere; PostgreSQL must have TEST_PG_CONNECTIONS (40) connections free, which test/preflight checks first; it binds no fixed port, so make run may serve beside it
	@$(MAKE) --no-print-directory test/preflight
	@logs=$$(mktemp -d); trap 'rm -rf $$logs' EXIT; failed=(); start=$$SECONDS; \
	for step in $(TEST_STEPS); do \
	  $(MAKE) --no-print-directory $$step 2>&1 | tee $$logs/$${step//\//_}.log; \
	  [ $${PIPESTATUS[0]} = 0 ] || failed+=("$$step"); \
	done; \
	echo; \
	grep -h '^make test: skipped ' $$logs/*.log || true; \
	if [ $${#failed[@]} = 0 ]; then echo "make test: every step passed in $$((SECONDS-start))s"; exit 0; fi; \
	echo "make test: $${#failed[@]} of $(words $(TEST_STEPS)) steps failed ($${failed[*]}) in $$((SECONDS-start))s:"; \
	grep -hE '^(FAIL|=== FAIL: |\s*--- FAIL|panic: |make\[[0-9]+\]: \*\*\*)|^\s*\S+\.go:[0-9]+:[0-9]+: ' $$logs/*.log | grep -v '^FAIL$$' | sed 's/^/  /'; \
	exit 1

.PHONY: test/preflight
test/preflight: ## name every program make test needs that is missing, one line each with its Debian package (tools/preflight.sh: curl, python3, redis-server and redis-cli fail it; npm, promtool and podman fail it when CI is set, and otherwise make test skips the step that needs them), then fail at once, in one line, unless PostgreSQL has TEST_PG_CONNECTIONS connections free and Redis answers
	@tools/preflight.sh
	@bin=$$(mktemp -d); trap 'rm -rf $$bin' EXIT; \
	  $(GO) build -o $$bin/testenv ./internal/testsupport/testdb/testenv && $$bin/testenv check -connections $(TEST_PG_CONNECTIONS)

.PHONY: test/service
test/service: $(GOTESTSUM) ## the service's module: go test -race ./... (TEST_P binaries at a time), then the tools module's own packages (the bench, the dashboard snapshot, the pictures of the mechanism)
	$(GOTEST) -race -timeout 15m ./...
	cd tools && $(GOTEST) -race -timeout 5m ./...

.PHONY: test/engine
test/engine: $(GOTESTSUM) ## the engine's modules on their own: each vetted and tested in its directory, all of them even when one fails (idempotency/integration also holds the dependency budget test)
	@failed=(); for m in $(ENGINE_MODULES); do echo "== $$m"; \
	  (cd $$m && $(GO) vet ./... && $(GOTEST) -race -timeout 10m ./...) || failed+=("$$m"); \
	done; [ $${#failed[@]} = 0 ] || { echo "test/engine: failed in $${failed[*]}"; exit 1; }

.PHONY: test/caddy
test/caddy: $(GOTESTSUM) ## build Caddy with the idempotency module (idempotency/caddymodule) and run it against the test upstream; the first run downloads Caddy's modules and builds for a few minutes
	cd $(CADDY_MODULE) && $(GO) vet ./... && $(GOTEST) -timeout 15m ./...

.PHONY: test/example
test/example: $(GOTESTSUM) ## build the examples (modules of their own, on the public engine alone: examples/widgets over HTTP, examples/transfers over gRPC) and run their tests against PostgreSQL, both even when one fails
	@failed=(); for e in examples/widgets examples/transfers; do echo "== $$e"; \
	  (cd $$e && $(GO) vet ./... && $(GOTEST) -race ./...) || failed+=("$$e"); \
	done; [ $${#failed[@]} = 0 ] || { echo "test/example: failed in $${failed[*]}"; exit 1; }

.PHONY: test/busy
test/busy: ## make test on a busy machine: a CPU loop on every core, another program holding all but TEST_PG_CONNECTIONS of PostgreSQL's free connections, and make run serving on 127.0.0.1:8080 (in memory); it all stops when make test ends
	@set -m; tmp=$$(mktemp -d); jobs=(); \
	stop() { for p in "$${jobs[@]}"; do kill -TERM -- -$$p 2>/dev/null; done; wait 2>/dev/null; rm -rf $$tmp; }; \
	trap stop EXIT; trap 'exit 130' INT TERM; \
	$(GO) build -o $$tmp/testenv ./internal/testsupport/testdb/testenv || exit 1; \
	$$tmp/testenv crowd -leave $(TEST_PG_CONNECTIONS) -ready $$tmp/crowded & jobs+=($$!); \
	for i in $$(seq 300); do [ -e $$tmp/crowded ] || ! kill -0 $${jobs[-1]} 2>/dev/null && break; sleep 0.1; done; \
	[ -e $$tmp/crowded ] || { echo "test/busy: the crowd of PostgreSQL connections did not start"; exit 1; }; \
	if (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null; then \
	  echo "test/busy: 127.0.0.1:8080 is taken already, so make run cannot serve there; that program stands in for it"; \
	else \
	  DATABASE_URL= $(MAKE) --no-print-directory run > $$tmp/run.log 2>&1 & jobs+=($$!); \
	  for i in $$(seq 1200); do curl -fs -o /dev/null http://127.0.0.1:8080/healthz && break; kill -0 $${jobs[-1]} 2>/dev/null || break; sleep 0.1; done; \
	  curl -fs -o /dev/null http://127.0.0.1:8080/healthz || { echo "test/busy: make run did not serve on 127.0.0.1:8080:"; cat $$tmp/run.log; exit 1; }; \
	  echo "test/busy: make run serves on 127.0.0.1:8080"; \
	fi; \
	for i in $$(seq $$(nproc)); do yes > /dev/null & jobs+=($$!); done; \
	echo "test/busy: $$(nproc) CPU loops running"; \
	$(MAKE) --no-print-directory test

.PHONY: verify/example
verify/example: ## fail if an example's go.mod is untidy or examples/widgets' generated server is stale
	cd examples/transfers && $(GO) mod tidy -diff
	cd examples/widgets && $(GO) mod tidy -diff && $(GO) generate ./...
	@if [ -n "$$(git status --porcelain -- examples/widgets/api)" ]; then \
		echo "examples/widgets/api is stale; run 'cd examples/widgets && go generate ./...' and commit"; exit 1; fi

.PHONY: test/alerts
test/alerts: ## unit-test deploy/prometheus/alerts.yml with promtool (Debian package prometheus; required when CI is set)
	@if command -v promtool >/dev/null 2>&1; then \
		cd deploy/prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml; \
	elif [ -n "$$CI" ]; then echo "promtool is required in CI (apt-get install prometheus)"; exit 1; \
	else echo "make test: skipped test/alerts, the alert rules' tests: promtool is missing (apt-get install prometheus)"; fi

.PHONY: test/sdk
test/sdk: ## the TypeScript SDK's tests but the live one (npm ci, npm run test:offline), among them its types as the released contract (api/openapi.released.yaml) has them reading a later server's new status (Node.js 20+ and npm; required when CI is set)
	@if command -v npm >/dev/null 2>&1; then \
		cd sdk/typescript && npm ci --no-audit --no-fund --silent && npm run --silent test:offline; \
	elif [ -n "$$CI" ]; then echo "npm is required in CI (apt-get install nodejs npm)"; exit 1; \
	else echo "make test: skipped test/sdk, the TypeScript SDK's tests: npm is missing (apt-get install nodejs npm)"; fi

.PHONY: test/sdks
test/sdks: ## official SDKs that make their own keys and retry (Stripe's Node SDK from tools/sdks/package.json, stripe-go) through oncekey proxy and through Caddy with the module, before a Stripe-shaped upstream that counts its runs: a slow first attempt, a reset, a 5xx, a gateway restarted, a reused key (npm ci; builds oncekey and Caddy; needs PostgreSQL, Node.js 20+ and npm); SDKS_MUTATION=profile-oncekey or no-template misconfigures the gateways to watch it fail
	@command -v npm >/dev/null 2>&1 || { echo "npm is required (apt-get install nodejs npm)"; exit 1; }
	cd tools/sdks && npm ci --no-audit --no-fund --silent && $(GO) vet ./... && $(GO) mod tidy -diff && \
	  $(GO) test -count=1 -p 1 -parallel 24 -timeout 10m ./...

.PHONY: scoreboard
scoreboard: ## oncekey conformance against Idempotency-Key libraries nobody here wrote (express-idempotency, @node-idempotency on NestJS and Fastify, AWS Lambda Powertools on Redis; npm ci in conformance/scoreboard) under every profile (oncekey, ietf, ietf-07, stripe, agent-commerce) and any PROFILES; writes conformance/scoreboard/SCOREBOARD.md (needs Node.js 20+, npm, jq, curl, Redis on 127.0.0.1:6379); exits 0 whatever the libraries score
	GO="$(GO)" conformance/scoreboard/run.sh

.PHONY: test/live
test/live: ## against a live 'oncekey serve': contract-test, the TypeScript SDK's tests, /docs in headless Chromium
	.ci/live-test

.PHONY: docs/cli
docs/cli: ## regenerate docs/cli.md from every command's --help (make test fails when it is stale)
	$(GO) test ./cmd/oncekey -run '^TestCLIReference$$' -count=1 -update

.PHONY: docs/problems
.PHONY: docs/architecture
docs/architecture: ## redraw ARCHITECTURE.md's picture of the products and the engine from go list (make test fails when it is stale)
	$(GO) test . -run '^TestArchitecturePicture$$' -count=1 -update

.PHONY: docs/alerts
docs/alerts: ## regenerate deploy/prometheus/README.md's list of alerts from alerts.yml (make test fails when it is stale)
	$(GO) test . -run '^TestAlertList$$' -count=1 -update

docs/problems: ## regenerate docs/problems.md from the problem table in internal/service/httpapi/errors.go (make test fails when it is stale)
	$(GO) test ./internal/service/httpapi -run '^TestProblemsReference$$' -count=1 -update

.PHONY: docs/images
docs/images: ## regenerate every picture in docs/img (the /docs screenshot, the dashboard snapshot, the benchmark chart, the two pictures of the mechanism) and record their sources in docs/img/SOURCES.sha256
	GO="$(GO)" tools/docs-images.sh render

.PHONY: docs/images/check
docs/images/check: ## fail if a picture in docs/img is stale: a file it is drawn from differs from docs/img/SOURCES.sha256
	@GO="$(GO)" tools/docs-images.sh check

.PHONY: docs/screenshot
docs/screenshot: ## refresh docs/img/api-docs.png: the /docs page of a live 'oncekey serve', every tag rendered
	GO="$(GO)" tools/docs-images.sh render api-docs

.PHONY: dashboard-snapshot
dashboard-snapshot: ## render docs/img/dashboard.png: the dashboard's main panels from a short local run
	GO="$(GO)" tools/docs-images.sh render dashboard

.PHONY: bench/chart
bench/chart: ## redraw docs/img/benchmarks.png and benchmarks-gateway.png from docs/benchmarks.json, measuring nothing
	GO="$(GO)" tools/docs-images.sh render benchmarks benchmarks-gateway

.PHONY: docs/mechanism
docs/mechanism: ## redraw the pictures of the mechanism, docs/img/request-sequence.svg and docs/img/gateway-key-states.svg, from their text sources in docs/img/src (tools/mechanism; make test fails when one is stale)
	GO="$(GO)" tools/docs-images.sh render request-sequence gateway-key-states

.PHONY: bench
bench: ## load benchmark: idempotent POST /orders against the baseline, side by side; writes docs/benchmarks.{md,json}, docs/img/benchmarks.png and benchmarks-gateway.png, fails when a target is missed
	$(GO) -C tools build -o ../bin/bench ./bench
	@# The chart is drawn even when a target is missed (bench then exits 1):
	@# its sources are recorded either way, then bench's status is make's.
	@status=0; bin/bench $(BENCHFLAGS) || status=$$?; tools/docs-images.sh record benchmarks benchmarks-gateway; exit $$status

.PHONY: bench/micro
bench/micro: ## Go micro-benchmarks (canonical JSON, packed records, fingerprint, the engine in process on memstore against a bare handler, the service's middleware on the in-memory store), benchstat-comparable
	cd idempotency && $(GO) test -run='^$$' -bench=. -benchmem -count=$(or $(COUNT),6) ./internal/canonjson/ ./internal/recordpack/ .
	$(GO) test -run='^$$' -bench=. -benchmem -count=$(or $(COUNT),6) ./internal/service/httpapi/

# The fuzz targets, each with its package's directory: `make fuzz` runs each
# for FUZZTIME (30s by default), .ci/run for a few seconds each.
FUZZ_TARGETS := FuzzCanonicalize:idempotency/internal/canonjson FuzzDifferentMeaning:idempotency/internal/canonjson \
	FuzzCheckFast:idempotency/internal/canonjson FuzzWriteFast:idempotency/internal/canonjson \
	FuzzCanonicalForm:idempotency/internal/canonform FuzzRoundTrip:idempotency/internal/recordpack \
	FuzzFingerprint:idempotency FuzzHandler:internal/service/httpapi FuzzOperationsOnPostgres:internal/service/httpapi

.PHONY: fuzz
fuzz: ## run every fuzz target (canonical JSON and forms, packed records, fingerprint, the whole handler, the operations on PostgreSQL) for FUZZTIME each (30s)
	GO="$(GO)" tools/fuzz.sh $(or $(FUZZTIME),30s) $(FUZZ_TARGETS)
