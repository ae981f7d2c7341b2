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

.PHONY: dev test test-short bench proto proto-check lint build tools

dev: ## run the whole platform in the foreground (ctrl-C stops it)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/flo ./libs/sdk/cmd/flo
	$(BIN)/flo dev

test: ## every test, against real Postgres and a real Kafka-protocol broker
	$(GO) test -count=1 -timeout 14m $(PKGS)

test-short: ## the quick tests only
	$(GO) test -short -count=1 $(PKGS)

bench: ## full cycle (invoke -> worker -> complete) on the embedded stack
	$(GO) run ./services/devstack/cmd/flo-bench

build: ## the service binaries and the CLI into ./bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./services/gateway/cmd/gateway ./services/dispatcher/cmd/dispatcher ./services/registry/cmd/registry ./libs/sdk/cmd/flo

lint: tools ## vet every module and lint the protos
	$(GO) vet $(PKGS)
	cd proto && buf lint
	@test -z "$$(gofmt -l $(MODULES))" || { gofmt -l $(MODULES); exit 1; }

tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-grpc-gateway $(BIN)/protoc-gen-openapiv2

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

proto: tools ## regenerate the Go code and OpenAPI document from proto/
	cd proto && rm -rf gen && buf generate && buf generate --template buf.gen.gateway.yaml --path flo/v1

proto-check: proto ## fail when the committed generated code is stale
	@git diff --exit-code --stat -- proto/gen || { echo "generated code is stale: run make proto and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/gen)" || { git status --porcelain -- proto/gen; echo "untracked generated files: run make proto and commit"; exit 1; }
