# redis-rl: build, run, test and benchmark the module. `make help` lists the targets by group.
#
# This file holds the shared variables, the module's two builds and the everyday targets; the
# other groups live in mk/*.mk, included at the end. Each mk file starts with a `##@ Heading`
# line and gives each target a `## comment`, which is what `make help` prints, in include order.

SHELL := /bin/bash
CARGO ?= cargo
REDIS_SERVER ?= redis-server
PORT ?= 6379
# The module, as the release and the debug build write it. Integration tests load the debug one.
MODULE := $(CURDIR)/target/release/libredis_rl.so
MODULE_DEBUG := $(CURDIR)/target/debug/libredis_rl.so
# Debian/Ubuntu packages the build and tests need, and the command each provides.
APT_PACKAGES := redis-server redis-tools clang libclang-dev lua5.1 binutils

.DEFAULT_GOAL := help
.PHONY: help deps build run test lint clean FORCE

##@ Start and test

help: ## List the targets, by group
	@echo "Usage: make <target> [NAME=value ...]"
	@awk -F ':.*## ' '/^##@ / { printf "\n%s\n", substr($$0, 5) } \
		/^[a-z][a-z0-9-]*:.*## / { printf "  make %-21s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

deps: ## Install missing system packages (apt-get, as root), or say what to install
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v redis-benchmark >/dev/null || missing="$$missing redis-tools"; \
	command -v clang >/dev/null || missing="$$missing clang"; \
	command -v lua5.1 >/dev/null || missing="$$missing lua5.1"; \
	command -v objdump >/dev/null || missing="$$missing binutils"; \
	ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "Missing system packages:$$missing"; \
		echo "Install them with: sudo apt-get install -y $(APT_PACKAGES)"; \
		echo "(elsewhere: a redis-server and redis-tools of 7.0 or newer, clang and libclang for bindgen, and lua5.1 for the client tests)"; \
		exit 1; \
	fi

build: $(MODULE) ## Build the module (target/release/libredis_rl.so)

run: build ## Start redis-server on 127.0.0.1:6379 with the module loaded (foreground)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "Port $(PORT) is already in use (another redis-server?). Stop it, or run: make run PORT=6380"; exit 1; fi
	$(REDIS_SERVER) --port $(PORT) --bind 127.0.0.1 --save "" --appendonly no --loadmodule $(MODULE)

test: $(MODULE_DEBUG) ## Run every test: unit, property, doc and real-server integration tests
	$(CARGO) test -p rl-bucket
	$(CARGO) test --lib --tests
	$(CARGO) test --doc --features system-alloc

lint: links ## clippy with warnings as errors, rustfmt --check, the Markdown link check (make links), the Functions library made from the script, the permissions table made from its JSON
	python3 clients/lua/functions.py --check
	python3 clients/vectors/permissions.py --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) fmt --all --check

clean: ## Remove build output
	$(CARGO) clean

# The module's .so, one file target per build. Cargo, not make, knows when it is stale (any
# source, Cargo.lock, a feature), so the recipe runs every time (FORCE) and cargo returns at
# once when nothing changed. `cargo test` does not build the cdylib the integration tests load:
# targets that run them depend on $(MODULE_DEBUG).
$(MODULE_DEBUG): deps FORCE
	$(CARGO) build --lib

$(MODULE): deps FORCE
	$(CARGO) build --release --lib

FORCE:

include mk/servers.mk
include mk/stress.mk
include mk/bench.mk
include mk/clients.mk
include mk/release.mk
include mk/docs.mk
include mk/envoy.mk
include mk/bench-memory.mk
include mk/image.mk
