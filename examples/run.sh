#!/usr/bin/env bash
# Runs the client examples' tests against a fresh server with the module:
#
#   examples/run.sh [python] [node] [rust]     (all three when none is named)
#
# Starts $REDIS_SERVER (default redis-server) with the module $RL_MODULE (default
# target/debug/libredis_rl.so) on a free loopback port in a temp dir, runs each suite with
# REDIS_URL=redis://127.0.0.1:PORT, stops the server, and fails if any suite failed.
#
# It installs nothing: `make examples` builds the module and installs redis-py and the node
# packages first. The Rust example builds into target/examples-rust (CARGO_TARGET_DIR).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODULE="${RL_MODULE:-$ROOT/target/debug/libredis_rl.so}"
SERVER="${REDIS_SERVER:-redis-server}"
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(python node rust)

if [ ! -f "$MODULE" ]; then
	echo "run.sh: no module at $MODULE (build it with: cargo build --lib, or set RL_MODULE)" >&2
	exit 1
fi
if ! command -v "$SERVER" >/dev/null; then
	echo "run.sh: $SERVER not found (make deps installs redis-server, or set REDIS_SERVER)" >&2
	exit 1
fi

DIR="$(mktemp -d)"
PID=""
stop() {
	if [ -n "$PID" ]; then
		kill "$PID" 2>/dev/null
		wait "$PID" 2>/dev/null
	fi
	rm -rf "$DIR"
}
trap stop EXIT

# Sends PING on a fresh connection; succeeds on +PONG (no redis-cli needed).
ping() {
	local reply=""
	exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf 'PING\r\n' >&3
	read -r -t 2 reply <&3
	exec 3<&- 3>&-
	[ "${reply%$'\r'}" = "+PONG" ]
}

# A port that is free now; the server may still lose a race for it, so starting retries.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
	local attempt i
	for attempt in 1 2 3 4 5; do
		PORT="$(free_port)"
		"$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --logfile server.log \
			--save "" --appendonly no --loadmodule "$MODULE" &
		PID=$!
		for i in $(seq 100); do
			if ping "$PORT" 2>/dev/null; then return 0; fi
			kill -0 "$PID" 2>/dev/null || break
			sleep 0.1
		done
		kill "$PID" 2>/dev/null
		wait "$PID" 2>/dev/null
		PID=""
	done
	echo "run.sh: $SERVER did not start; its log:" >&2
	cat "$DIR/server.log" >&2
	return 1
}

start || exit 1
export REDIS_URL="redis://127.0.0.1:$PORT"
echo "run.sh: $("$SERVER" --version | head -1) with $MODULE on $REDIS_URL"

# redis-py and the redis_rl library come from PYTHONPATH (`make examples` passes its pip
# --target installs) or from python3's own environment.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/examples-rust}"

run_suite() {
	case "$1" in
	python) (cd "$ROOT/examples/python" && python3 test_example.py) ;;
	node)
		if [ ! -d "$ROOT/examples/node/node_modules" ]; then
			echo "run.sh: examples/node/node_modules is missing (run: cd examples/node && npm ci)" >&2
			return 1
		fi
		(cd "$ROOT/examples/node" && npm test --silent)
		;;
	rust) (cd "$ROOT/examples/rust" && cargo test --locked) ;;
	*)
		echo "run.sh: unknown suite '$1' (python, node, rust)" >&2
		return 1
		;;
	esac
}

passed=0
failed=()
for suite in "${SUITES[@]}"; do
	echo "=== examples/$suite"
	if run_suite "$suite"; then
		passed=$((passed + 1))
	else
		failed+=("$suite")
	fi
done

[ ${#failed[@]} -eq 0 ] || echo "=== failed: ${failed[*]}"
echo "examples: ${passed} passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
