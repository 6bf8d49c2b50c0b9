#!/usr/bin/env bash
# make bench-clients-rust: what the deny cache saves when one client floods a denied key,
# through the Rust library (clients/rust/examples/flood.rs, the same contract as
# clients/node/bench/flood.mjs, so clients/bench/bench_clients.py can call it too).
#
#   clients/rust/bench/flood.sh [CALLS]     (default 20000)
#
# For each path (the module; the Lua script on a plain server) starts a redis-server on a
# free loopback port in a temp dir, floods CALLS calls after the take and the first denial,
# with the shield off and on, and prints the calls that reached the server (INFO
# commandstats) and the p50 / p99 latency of a call as the caller sees it. Asserts nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
CALLS="${1:-20000}"
MODULE="${RL_MODULE:-$ROOT/target/debug/libredis_rl.so}"
SERVER="${REDIS_SERVER:-redis-server}"
CLI="${REDIS_CLI:-redis-cli}"
BIN="$ROOT/target/release/examples/flood"

DIR=""
PID=""
stop() {
	if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
	PID=""
	if [ -n "$DIR" ]; then rm -rf "$DIR"; fi
	DIR=""
}
trap stop EXIT

echo "| path | shield | calls | reached Redis | p50 µs | p99 µs |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for path in module lua; do
	DIR="$(mktemp -d)"
	PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
	load=()
	[ "$path" = module ] && load=(--loadmodule "$MODULE")
	"$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
		--logfile server.log "${load[@]}" &
	PID=$!
	for _ in $(seq 100); do "$CLI" -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
	command=rl.acquire
	[ "$path" = lua ] && command=evalsha
	for shield in 0 1; do
		"$CLI" -p "$PORT" config resetstat >/dev/null
		times="$("$BIN" "$PORT" "hot$shield" "$CALLS" "$shield")"
		reached="$("$CLI" -p "$PORT" info commandstats | tr -d '\r' |
			grep -i "^cmdstat_$command:" | sed 's/^[^:]*:calls=\([0-9]*\).*/\1/')"
		echo "$times" | python3 -c "
import json, sys
t = sorted(json.load(sys.stdin)); n = len(t)
print('| $path | ' + ('on' if '$shield' == '1' else 'off') + ' | %d | $reached | %.1f | %.1f |'
      % (n + 2, t[n // 2], t[min(n - 1, int(n * 0.99))]))"
	done
	stop
done
echo
echo "$("$SERVER" --version | head -1); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
