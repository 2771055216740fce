# bushost: see README.md. Every target works on a fresh Debian 12 machine
# once .ci/run's packages are installed.

GO       ?= go
BIN      := bin
TOOLS    := $(CURDIR)/.tools
HOME_DIR ?= ./bus-host

BUF_VERSION          := v1.75.0
PROTOC_GEN_GO        := v1.36.12
PROTOC_GEN_GO_GRPC   := v1.6.2

CMDS := bushostd bushost sandbox supervisor

.PHONY: all build run test bench soak fuzz generate lint clean tools

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

run: build
	./$(BIN)/bushostd serve --home $(HOME_DIR)

test:
	$(GO) test -race -timeout 45m ./...

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

soak:
	BUSHOST_SOAK=1 $(GO) test -race -run 'Crash|Soak' -timeout 60m ./integration/

fuzz:
	./scripts/fuzz.sh 60s

tools:
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC)

generate: tools
	rm -rf api
	$(TOOLS)/buf lint
	$(TOOLS)/buf generate

clean:
	rm -rf $(BIN)
