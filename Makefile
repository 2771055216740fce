# bushost: see README.md. Every target works on a fresh Debian 12 machine
# once .ci/run's packages are installed.

GO       ?= go
BIN      := bin
TOOLS    := $(CURDIR)/.tools
HOME_DIR ?= ./bus-host

BUF_VERSION          := v1.75.0
PROTOC_GEN_GO        := v1.36.12
PROTOC_GEN_GO_GRPC   := v1.6.2

CMDS := bushostd bushost sandbox sandbox-init supervisor

# grpcnotrace leaves golang.org/x/net/trace (and html/template with it) out
# of the binaries: nothing here uses gRPC's request tracing, and every
# `bushost` call would pay for its package initialisation. netgo keeps
# the binaries static: with Go's own resolver (which reads /etc/hosts and
# /etc/resolv.conf, as nsswitch's files and dns do) `net` links no C
# library, and no start loads one: the sandbox starts twice per session,
# as sandbox run and as the session's pid 1 (docs/performance.md).
BUILD_TAGS := grpcnotrace,netgo

# make install [PREFIX=/usr/local] [DESTDIR=]: binaries, systemd units
# (with the binaries' path written in), the sysusers entry for the bushost
# user and group, the docs with the supervisor's reference
# (supervisor.md) and an example configuration and seed (examples/), and
# that example as the supervisor unit's configuration and seed in
# $(SYSCONFDIR)/bushost, only where there is none: an operator's edits are
# never replaced (docs/operations.md).
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
DOCDIR      ?= $(PREFIX)/share/doc/bushost
EXAMPLEDIR  ?= $(DOCDIR)/examples
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
SYSCONFDIR  ?= /etc

# make container: the seed's container (deploy/container), built with
# podman from a Debian base that scripts/container-base.sh makes.
PODMAN        ?= podman --runtime runc --cgroup-manager=cgroupfs
IMAGE         ?= localhost/bushost-supervisor:latest
CONTAINER_CTX ?= build/container

.PHONY: all deps deps-run deps-container build install container run test bench soak fuzz generate clean tools

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -tags $(BUILD_TAGS) -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(EXAMPLEDIR)
	install -m 0755 $(addprefix $(BIN)/,$(CMDS)) $(DESTDIR)$(BINDIR)/
	for u in bushostd.service bushostd.socket supervisor.service sandbox-serve.service; do \
		sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' deploy/systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	install -m 0644 deploy/systemd/bushost.sysusers $(DESTDIR)$(SYSUSERSDIR)/bushost.conf
	install -m 0644 README.md docs/*.md $(DESTDIR)$(DOCDIR)/
	install -m 0644 internal/supervisor/README.md $(DESTDIR)$(DOCDIR)/supervisor.md
	install -m 0644 deploy/supervisor/supervisor.toml $(DESTDIR)$(EXAMPLEDIR)/supervisor.toml
	rm -rf $(DESTDIR)$(EXAMPLEDIR)/seed && cp -R deploy/supervisor/seed $(DESTDIR)$(EXAMPLEDIR)/seed
	install -d $(DESTDIR)$(SYSCONFDIR)/bushost
	[ -e $(DESTDIR)$(SYSCONFDIR)/bushost/supervisor.toml ] || \
		install -m 0644 deploy/supervisor/supervisor.toml $(DESTDIR)$(SYSCONFDIR)/bushost/supervisor.toml
	[ -e $(DESTDIR)$(SYSCONFDIR)/bushost/seed ] || cp -R deploy/supervisor/seed $(DESTDIR)$(SYSCONFDIR)/bushost/seed

container: deps-container build
	scripts/container-base.sh
	rm -rf $(CONTAINER_CTX) && mkdir -p $(CONTAINER_CTX)/bin
	cp -r deploy/container/Dockerfile deploy/container/supervisor.toml deploy/container/seed $(CONTAINER_CTX)/
	cp $(BIN)/supervisor $(CONTAINER_CTX)/bin/
	$(GO) build -o $(CONTAINER_CTX)/bin/hello ./deploy/container/hello
	$(PODMAN) build -q --format docker -t $(IMAGE) $(CONTAINER_CTX)

# What each use needs (scripts/deps.sh): running is git and bubblewrap;
# the container adds podman, runc and debootstrap; the tests add those and
# PostgreSQL, curl, python3, podman-compose, systemd-analyze, nodejs, npm.
deps:
	scripts/deps.sh test

deps-run:
	scripts/deps.sh run

deps-container:
	scripts/deps.sh container

run: deps-run build
	./$(BIN)/bushostd serve --home $(HOME_DIR)

# A -race binary sleeps a second at exit unless GORACE says
# atexit_sleep_ms=0; the tests start thousands of them (every bushost call).
export GORACE ?= atexit_sleep_ms=0

# The broker's PostgreSQL half needs a server: BUSHOST_TEST_PG_DSN, or a
# throwaway cluster that scripts/pg.sh starts under /var/tmp/bushost-pg.
# scripts/test.sh runs every package with -race, the integration tests in
# BUSHOST_TEST_SHARDS (default 2) processes beside the rest.
test: deps
	@dsn="$${BUSHOST_TEST_PG_DSN:-$$(scripts/pg.sh start 2>/dev/null || true)}"; \
	if [ -z "$$dsn" ] && [ "$$BUSHOST_TEST_REQUIRE_ALL" = 1 ]; then echo "make test: no PostgreSQL started (scripts/pg.sh start) and BUSHOST_TEST_REQUIRE_ALL=1 needs one" >&2; exit 1; fi; \
	if [ -z "$$dsn" ]; then echo "!!! NO POSTGRESQL: the PostgreSQL half of the broker suite will be SKIPPED !!!" >&2; \
	else echo "PostgreSQL for tests: $$dsn"; fi; \
	BUSHOST_TEST_PG_DSN="$$dsn" GO=$(GO) scripts/test.sh -timeout 90m

# Every benchmark once; each prints its figures as metrics named as
# docs/performance.md's tables name them. BenchmarkPushGrowth at full size
# alone takes about an hour on a loaded 2-core VM.
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 3h ./...

soak:
	BUSHOST_SOAK=1 $(GO) test -race -run 'Crash|Soak|AgainstGit' -timeout 120m ./integration/

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
