##@ Benchmarks
# The module against the Lua script and plain commands, its pure math, and the client libraries.
# Figures are taken on a quiet machine; the -smoke targets only check that each one runs.

BENCH_TABLE_BUCKETS ?= 1000000

.PHONY: bench bench-smoke bench-instructions bench-multi bench-tables bench-math \
	bench-clients bench-clients-smoke bench-clients-rust

bench: $(MODULE) ## Benchmark RL.ACQUIRE vs the Lua script and plain commands; writes bench/results.md and chart.svg
	python3 bench/bench.py

bench-smoke: $(MODULE) ## Seconds-long bench run for CI: checks each benchmarked command works, no timing (temp dir)
	python3 bench/bench.py --smoke
	python3 bench/tables.py --smoke

# The fallback's 10 numbers for bench.py's allowed (rate, capacity, cost) at 10/s and 3/s, and
# its denial at 10/s, as bench.py computes them, packed as the client libraries send them
# (hex:<the 80 bytes>, which instructions.sh sends from Python); and the scripts' SHA1s.
fallback_numbers = $(shell python3 -c "import sys; sys.path.insert(0, 'bench'); import bench; print('hex:' + bench.script_packed(*'$(1)'.split()).hex())")
CLASSIC_SHA = $(shell sha1sum < bench/token_bucket.lua | cut -c1-40)
RL_SHA = $(shell sha1sum < clients/lua/rl.lua | cut -c1-40)

bench-instructions: $(MODULE) ## Instructions per call inside Redis's call() (callgrind): allowed RL.ACQUIRE against SET PX, a lease taken and released and a reservation settled (per pair, new keys) against it and RL.ACQUIRE + RL.REFUND, denials against HMGET, the Lua fallback (EVALSHA, FCALL) against the classic script, mostly new keys and then updates (1,000 keys)
	@command -v valgrind >/dev/null || { echo "bench-instructions: needs valgrind (apt-get install valgrind)"; exit 1; }
	bench/instructions.sh $(MODULE) SET b:__rand_int__ 1234567890123456789 PX 60000
	bench/instructions.sh $(MODULE) RL.ACQUIRE b:__rand_int__ 10 1e10 1000
	bench/instructions.sh $(MODULE) RL.ACQUIRE b:__rand_int__ 3 3e9 301
	bench/instructions.sh $(MODULE) RL.LEASE l:__rand_int__ 10 60000 ID w + RL.RELEASE l:__rand_int__ w
	bench/instructions.sh $(MODULE) RL.ACQUIRE a:__rand_int__ 10 1e10 1000 + RL.REFUND a:__rand_int__ 10 1e10 500
	bench/instructions.sh $(MODULE) RL.RESERVE r:__rand_int__ 10 1e10 1000 60000 ID w + RL.SETTLE r:__rand_int__ 10 1e10 w 500
	PREFILL="HSET hot tokens 8.0000029999999995 ts 1796140153985" bench/instructions.sh $(MODULE) HMGET hot tokens ts
	PREFILL="RL.ACQUIRE hot 10 1e7 1e7" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) RL.ACQUIRE hot 10 1e7 1e7
	PREFILL="RL.ACQUIRE hot 3 3000001 3000001" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) RL.ACQUIRE hot 3 3000001 3000001
	PREFILL="RL.ACQUIRE hot 0.000001 1 1" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) RL.ACQUIRE hot 0.000001 1 1
	PREFILL="RL.HACQUIRE tbl hot 10 1e7 1e7" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) RL.HACQUIRE tbl hot 10 1e7 1e7
	PREFILL="RL.HACQUIRE tbl hot 3 3000001 3000001" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) RL.HACQUIRE tbl hot 3 3000001 3000001
	LOAD=bench/token_bucket.lua bench/instructions.sh $(MODULE) EVALSHA $(CLASSIC_SHA) 1 b:__rand_int__ 10 1e10 1796183560421 1000
	LOAD=bench/token_bucket.lua bench/instructions.sh $(MODULE) EVALSHA $(CLASSIC_SHA) 1 b:__rand_int__ 3 3e9 1796183560421 301
	LOAD=clients/lua/rl.lua bench/instructions.sh $(MODULE) EVALSHA $(RL_SHA) 1 b:__rand_int__ $(call fallback_numbers,10 1e10 1000)
	LOAD=clients/lua/rl.lua bench/instructions.sh $(MODULE) EVALSHA $(RL_SHA) 1 b:__rand_int__ $(call fallback_numbers,3 3e9 301)
	LOAD=clients/lua/rl_functions.lua bench/instructions.sh $(MODULE) FCALL rl_acquire_packed 1 b:__rand_int__ $(call fallback_numbers,10 1e10 1000)
	LOAD=clients/lua/rl_functions.lua bench/instructions.sh $(MODULE) FCALL rl_acquire_packed 1 b:__rand_int__ $(call fallback_numbers,3 3e9 301)
	@# The same on 1,000 keys, where nearly every call updates a bucket (a pipelined run of
	@# bench.py is mostly updates: 200,000 calls on 100,000 keys).
	KEYSPACE=1000 LOAD=bench/token_bucket.lua bench/instructions.sh $(MODULE) EVALSHA $(CLASSIC_SHA) 1 b:__rand_int__ 10 1e10 1796183560421 1000
	KEYSPACE=1000 LOAD=bench/token_bucket.lua bench/instructions.sh $(MODULE) EVALSHA $(CLASSIC_SHA) 1 b:__rand_int__ 3 3e9 1796183560421 301
	KEYSPACE=1000 LOAD=clients/lua/rl.lua bench/instructions.sh $(MODULE) EVALSHA $(RL_SHA) 1 b:__rand_int__ $(call fallback_numbers,10 1e10 1000)
	KEYSPACE=1000 LOAD=clients/lua/rl.lua bench/instructions.sh $(MODULE) EVALSHA $(RL_SHA) 1 b:__rand_int__ $(call fallback_numbers,3 3e9 301)
	KEYSPACE=1000 LOAD=clients/lua/rl_functions.lua bench/instructions.sh $(MODULE) FCALL rl_acquire_packed 1 b:__rand_int__ $(call fallback_numbers,10 1e10 1000)
	KEYSPACE=1000 LOAD=clients/lua/rl_functions.lua bench/instructions.sh $(MODULE) FCALL rl_acquire_packed 1 b:__rand_int__ $(call fallback_numbers,3 3e9 301)
	LOAD=clients/lua/rl.lua PREFILL="EVALSHA $(RL_SHA) 1 hot $(call fallback_numbers,10 1e7 1e7)" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) EVALSHA $(RL_SHA) 1 hot $(call fallback_numbers,10 1e7 1e7)
	LOAD=clients/lua/rl_functions.lua PREFILL="FCALL rl_acquire_packed 1 hot $(call fallback_numbers,10 1e7 1e7)" EXPECT_DENIED=1 bench/instructions.sh $(MODULE) FCALL rl_acquire_packed 1 hot $(call fallback_numbers,10 1e7 1e7)

bench-multi: $(MODULE) ## Server time of one RL.ACQUIRE.MULTI at 1,000 (the cap) and more buckets (release build)
	python3 bench/multi.py --sizes 10,100,1000,1001 --rounds 5

bench-tables: $(MODULE) ## DUMP, RESTORE, DEBUG RELOAD per entry of one table against a hash (BENCH_TABLE_BUCKETS=1000000), and MIGRATE of both at 10k to 1M entries; writes bench/tables.md
	python3 bench/tables.py --buckets $(BENCH_TABLE_BUCKETS) --rounds 5 --out bench/tables.md

# `make bench` writes the tables page too (the MIGRATE sizing that docs/tables.md quotes).
bench: bench-tables

bench-math: ## Criterion micro-benchmark of the pure bucket math and argument parsing
	$(CARGO) bench --features system-alloc --bench bucket

# The client benchmarks run the Python library from its source tree.
bench-clients: deps-clients $(MODULE_DEBUG) ## Flood one denied key through the Python and Node libraries, with and without the shield; writes clients/bench/results.md
	PYTHONPATH="$(CURDIR)/clients/python/src:$(PYTHON_DEPS)" python3 clients/bench/bench_clients.py

bench-clients-smoke: deps-clients $(MODULE_DEBUG) ## Seconds-long bench-clients for CI: checks it works, writes nothing
	PYTHONPATH="$(CURDIR)/clients/python/src:$(PYTHON_DEPS)" python3 clients/bench/bench_clients.py --smoke

bench-clients-rust: $(MODULE_DEBUG) ## Flood one denied key through the Rust client, shield off and on: calls reaching Redis, p50/p99 (BENCH_CALLS=20000)
	$(CARGO) build --release -p redis-rl-client --example flood
	RL_MODULE="$(MODULE_DEBUG)" REDIS_SERVER="$(REDIS_SERVER)" clients/rust/bench/flood.sh $(or $(BENCH_CALLS),20000)
