##@ Benchmarks: memory
# The memory test of `make bench` on its own (bench/bench.py --memory-only): bytes per bucket
# in a table, in a key per bucket, in the Lua script's hash and in the SET PX floor, on
# REDIS_SERVER and on Valkey, written to bench/memory.md and drawn as bench/memory.svg. About
# a minute per server; sizes and timing do not matter to it, so it needs no quiet machine.

.PHONY: bench-memory bench-memory-smoke

# $(call bench_memory,extra args): the memory test on REDIS_SERVER and VALKEY_SERVER.
bench_memory = python3 bench/bench.py --memory-only --redis-server "$(REDIS_SERVER)" \
	--also-server "$(VALKEY_SERVER)" $(1)

bench-memory: deps-valkey $(MODULE) ## Bytes per bucket (table, key per bucket, Lua, floor) on Redis and Valkey: bench/memory.md and memory.svg
	$(need_valkey)
	$(call bench_memory,)

bench-memory-smoke: deps-valkey $(MODULE) ## The memory test at 1,000 buckets on both servers, output in a temp dir (checks it runs)
	$(need_valkey)
	$(call bench_memory,--smoke)

# `make bench` writes the memory page and its chart too.
bench: bench-memory
