# redis-rl: build, run, test and benchmark the module. `make help` lists the targets.

SHELL := /bin/bash
CARGO ?= cargo
REDIS_SERVER ?= redis-server
PORT ?= 6379
MODULE := $(CURDIR)/target/release/libredis_rl.so
# Debian/Ubuntu packages the build and tests need, and the command each provides.
APT_PACKAGES := redis-server redis-tools clang libclang-dev

.DEFAULT_GOAL := help
.PHONY: help deps build run test lint clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

deps: ## Install missing system packages (apt-get, as root), or say what to install
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v redis-benchmark >/dev/null || missing="$$missing redis-tools"; \
	command -v clang >/dev/null || missing="$$missing clang"; \
	ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
		echo "Missing system packages:$$missing"; \
		echo "Install them with: sudo apt-get install -y $(APT_PACKAGES)"; \
		echo "(elsewhere: a redis-server and redis-tools of 7.0 or newer, plus clang and libclang for bindgen)"; \
		exit 1; \
	fi

build: deps ## Build the module (target/release/libredis_rl.so)
	$(CARGO) build --release --lib

run: build ## Start redis-server on 127.0.0.1:6379 with the module loaded (foreground)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "Port $(PORT) is already in use (another redis-server?). Stop it, or run: make run PORT=6380"; exit 1; fi
	$(REDIS_SERVER) --port $(PORT) --bind 127.0.0.1 --save "" --appendonly no --loadmodule $(MODULE)

test: deps ## Run every test: unit, property, doc and real-server integration tests
	@# cargo test does not rebuild the cdylib the integration tests load, so build it first.
	$(CARGO) build --lib
	$(CARGO) test --lib --tests
	$(CARGO) test --doc --features system-alloc

lint: ## clippy with warnings as errors, and rustfmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) fmt --check

.PHONY: bench bench-smoke

bench: deps ## Benchmark RL.ACQUIRE vs the Lua script and plain commands; writes bench/results.md and chart.svg
	$(CARGO) build --release --lib
	python3 bench/bench.py

bench-smoke: deps ## Seconds-long bench run for CI: checks each benchmarked command works, no timing (temp dir)
	$(CARGO) build --release --lib
	python3 bench/bench.py --smoke

clean: ## Remove build output
	$(CARGO) clean
