# Flo in Go. `make dev` runs the platform on this machine; `make test` tests it.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

# Every module of the workspace, as import-path patterns.
MODULES := $(shell $(GO) work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
PKGS := $(foreach m,$(MODULES),$(m)/...)

BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
GRPC_GATEWAY_VERSION := v2.32.0
VTPROTO_VERSION := v0.6.0
# River's CLI, for `make bench`'s run of `river bench` beside ours: the newest
# release of github.com/riverqueue/river/cmd/river this box's module proxy
# serves.
RIVER_VERSION := v0.26.0
RIVER := $(BIN)/river-$(RIVER_VERSION)

# The service binaries, each built into its own image (deploy/Dockerfile).
SERVICES := gateway dispatcher registry streams workflow
IMAGE_PREFIX ?= flo-
IMAGE_TAG ?= dev
COMPOSE ?= docker compose
COMPOSE_FILE := deploy/compose/docker-compose.yaml
# The compose stack's tokens (deploy/compose/flo.env.example says what is in it).
COMPOSE_ENV := deploy/compose/flo.env

.PHONY: dev test fuzz test-short bench river proto proto-check lint build tools images compose-up compose-down k8s-check

dev: ## run the whole platform in the foreground (ctrl-C stops it)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/flo ./libs/sdk/cmd/flo
	$(BIN)/flo dev

# Fuzz targets: `make test` runs each for FUZZTIME on top of its seed corpus
# (which every plain `go test` runs); `make fuzz FUZZTIME=10m` digs deeper.
# The default is a count of inputs, not a duration: Go before 1.27 can fail a
# duration-bound run with "context deadline exceeded" when its time runs out
# while a worker is busy (golang/go#75804), with nothing wrong with the target.
FUZZ_TARGETS := FuzzParse:./services/workflow/internal/definition \
	FuzzResolve:./services/workflow/internal/mapping \
	FuzzAdvance:./services/workflow/internal/engine \
	FuzzPartition:./services/dispatcher/internal/engine \
	FuzzPublicMatchesProtoUnmarshal:./proto/codec
FUZZTIME ?= 50000x

test: ## every test, against real Postgres and a real Kafka-protocol broker, then each fuzz target briefly
	$(GO) test -count=1 -timeout 14m $(PKGS)
	$(MAKE) fuzz

fuzz: ## run each fuzz target for FUZZTIME
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t%%:*}$$" -fuzztime $(FUZZTIME) "$${t#*:}"; \
	done

test-short: ## the quick tests only
	$(GO) test -short -count=1 $(PKGS)

bench: $(RIVER) ## River's own benchmark beside ours, then actions, streams, workflows, plans, a backlog and idle workers on the embedded stack, a few minutes in all (docs/benchmarks.md)
	$(GO) build -o $(BIN)/flo-bench ./services/devstack/cmd/flo-bench
	$(BIN)/flo-bench -mode river -river $(RIVER) -sustain 30s
	$(BIN)/flo-bench -mode actions -sustain 30s -batch 100 -invokers 8 -rate 1000
	$(BIN)/flo-bench -mode actions -sustain 10s -rate 1000
	$(BIN)/flo-bench -mode streams -records 100000 -batch 100
	$(BIN)/flo-bench -mode workflows -runs 3000
	$(BIN)/flo-bench -mode workflows -sustain 20s -starters 128 -backlog 3000 -rate 100
	$(BIN)/flo-bench -mode plans -runs 2000
	$(BIN)/flo-bench -mode backlog -tasks 300000 -batch 1000 -invokers 4
	FLO_MAX_WORKERS_PER_NAMESPACE=1000 $(BIN)/flo-bench -mode workers -workers 1000 -settle 20s -idle 20s -over-limit

river: $(RIVER) ## River's CLI into ./bin, for `make bench`

# Built in a throwaway module: `go install ...@version` also asks for the
# module's latest version, which a partial module mirror may not answer.
$(RIVER):
	@mkdir -p $(BIN)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && export GOWORK=off && \
		$(GO) mod init riverbench && \
		$(GO) get github.com/riverqueue/river/cmd/river@$(RIVER_VERSION) && \
		$(GO) build -o $(RIVER) github.com/riverqueue/river/cmd/river

build: ## the service binaries and the CLI into ./bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(foreach s,$(SERVICES),./services/$(s)/cmd/$(s)) ./libs/sdk/cmd/flo

images: ## one image per service: $(IMAGE_PREFIX)<service>:$(IMAGE_TAG) (needs Docker with BuildKit)
	@for s in $(SERVICES); do \
		echo "building $(IMAGE_PREFIX)$$s:$(IMAGE_TAG)"; \
		docker build -f deploy/Dockerfile --build-arg SERVICE=$$s -t $(IMAGE_PREFIX)$$s:$(IMAGE_TAG) . || exit 1; \
	done

compose-up: $(COMPOSE_ENV) ## the platform in docker compose: Redpanda, Postgres, OTel collector, Jaeger, services, quick-start worker
	$(COMPOSE) --env-file $(COMPOSE_ENV) -f $(COMPOSE_FILE) up --build --detach
	@echo "gRPC localhost:9000, REST http://localhost:8080/v1/..., Jaeger http://localhost:16686"
	@echo "admin key: export $$(grep '^FLO_ADMIN_TOKEN=' $(COMPOSE_ENV) | sed 's/^FLO_ADMIN_TOKEN=/FLO_TOKEN=/')"

compose-down: $(COMPOSE_ENV) ## stop the compose stack (its volumes stay; add -v by hand to remove them)
	$(COMPOSE) --env-file $(COMPOSE_ENV) -f $(COMPOSE_FILE) down

# Fresh random tokens, readable by their owner only, made once.
$(COMPOSE_ENV):
	@umask 077; printf 'FLO_ADMIN_TOKEN=flo_admin_%s\nFLO_INTERNAL_TOKEN=%s\n' "$$(openssl rand -hex 32)" "$$(openssl rand -hex 32)" > $@
	@echo "wrote $@"

k8s-check: ## build every kustomize overlay and check the objects offline
	$(GO) test -count=1 -run 'Kubernetes' ./deploy

lint: tools ## vet every module and lint the protos
	$(GO) vet $(PKGS)
	cd proto && buf lint
	@test -z "$$(gofmt -l $(MODULES))" || { gofmt -l $(MODULES); exit 1; }

tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-grpc-gateway $(BIN)/protoc-gen-openapiv2 $(BIN)/protoc-gen-go-vtproto

$(BIN)/buf:
	GOBIN=$(BIN) GOWORK=off $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) GOWORK=off $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) GOWORK=off $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(BIN)/protoc-gen-grpc-gateway:
	GOBIN=$(BIN) GOWORK=off $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION)
$(BIN)/protoc-gen-openapiv2:
	GOBIN=$(BIN) GOWORK=off $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)
$(BIN)/protoc-gen-go-vtproto:
	GOBIN=$(BIN) GOWORK=off $(GO) install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@$(VTPROTO_VERSION)

proto: tools ## regenerate the Go code and OpenAPI document from proto/
	cd proto && rm -rf gen && buf generate && buf generate --template buf.gen.gateway.yaml --path flo/v1

proto-check: proto ## fail when the committed generated code is stale
	@git diff --exit-code --stat -- proto/gen || { echo "generated code is stale: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/gen)" || { git status --porcelain -- proto/gen; echo "untracked generated files: run make proto and commit"; exit 1; }
