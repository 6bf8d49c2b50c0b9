#!/usr/bin/env bash
# make envoy-demo: Redis with the module, redis-rl-envoy, an upstream (a few lines of
# python3) and Envoy, all on free ports on 127.0.0.1; a burst with curl, a 429, a token
# quota charged after each answer and its 429, then everything stops. It exits non-zero
# when a step does not answer as shown (the burst's 429, the quota's charges and its 429), so
# `make envoy-demo` fails rather than printing a wrong story.
#
# Environment (the Makefile sets them): MODULE (the module .so), SERVICE (redis-rl-envoy),
# ENVOY (the envoy binary), REDIS_SERVER (default redis-server).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REDIS_SERVER="${REDIS_SERVER:-redis-server}"
: "${MODULE:?MODULE (the module .so) is not set}" "${SERVICE:?SERVICE is not set}" "${ENVOY:?ENVOY is not set}"

RUN="$(mktemp -d)"
PIDS=()
stop() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$RUN"
}
trap stop EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # url, what
    for _ in $(seq 1 300); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
    echo "envoy-demo: $2 did not come up" >&2; exit 1
}
REDIS_PORT=$(free_port) HTTP_PORT=$(free_port) GRPC_PORT=$(free_port)
UPSTREAM_PORT=$(free_port) LISTEN_PORT=$(free_port) ADMIN_PORT=$(free_port) METRICS_PORT=$(free_port)

"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --loadmodule "$MODULE" >"$RUN/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

RUNTIME_ROOT="$HERE" RUNTIME_APPDIRECTORY=config REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS_PORT" \
    HOST=127.0.0.1 PORT="$HTTP_PORT" GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC_PORT" RL_ON_ERROR=open \
    USE_PROMETHEUS=true PROMETHEUS_ADDR="127.0.0.1:$METRICS_PORT" \
    "$SERVICE" >"$RUN/service.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$HTTP_PORT/healthcheck" "redis-rl-envoy"

# The upstream: "hello" for any path; /v1/chat answers as an LLM would and reports the
# tokens it used (the x-tokens header of the request, to keep the demo predictable) in
# x-tokens-used, which Envoy charges to the user's quota when the answer is done.
cat >"$RUN/upstream.py" <<'PY'
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the upstream\n"
        self.send_response(200)
        if self.path.startswith("/v1/chat"):
            body = b"an answer\n"
            self.send_header("x-tokens-used", self.headers.get("x-tokens", "1"))
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PY
python3 "$RUN/upstream.py" "$UPSTREAM_PORT" >"$RUN/upstream.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$UPSTREAM_PORT/" "the upstream"

sed -e "s/@ADMIN_PORT@/$ADMIN_PORT/" -e "s/@LISTEN_PORT@/$LISTEN_PORT/" \
    -e "s/@UPSTREAM_PORT@/$UPSTREAM_PORT/" -e "s/@GRPC_PORT@/$GRPC_PORT/" \
    "$HERE/envoy.yaml" >"$RUN/envoy.yaml"
"$ENVOY" -c "$RUN/envoy.yaml" --use-dynamic-base-id --log-level warn >"$RUN/envoy.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$ADMIN_PORT/ready" "Envoy"

echo "Envoy on 127.0.0.1:$LISTEN_PORT asks redis-rl-envoy (gRPC $GRPC_PORT) before each request."
echo "alice may make 5 requests per minute: a burst of 5, then one every 12 s."
echo
fail() { echo "envoy-demo: FAILED: $*" >&2; exit 1; }
for i in 1 2 3 4 5 6; do
    echo "\$ curl -H 'x-user: alice' http://127.0.0.1:$LISTEN_PORT/   (request $i)"
    head=$(curl -s -o /dev/null -D - -H 'x-user: alice' "http://127.0.0.1:$LISTEN_PORT/" | tr -d '\r')
    grep -iE '^(HTTP/|x-ratelimit-)' <<<"$head" | sed 's/^/  /'
    code=$(awk 'NR == 1 {print $2}' <<<"$head")
    # The burst is 5: requests 1 to 5 pass, the 6th is refused (12 s pass before a refill).
    if [ "$i" -le 5 ]; then want=200; else want=429; fi
    [ "$code" = "$want" ] || fail "alice's request $i answered HTTP ${code:-none}, expected $want"
done
echo
echo "bob is independent:"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: bob' "http://127.0.0.1:$LISTEN_PORT/")
echo "  HTTP $code"
[ "$code" = 200 ] || fail "bob's request answered HTTP $code, expected 200"
echo
echo "The same decision over HTTP (POST /json, protojson in and out):"
json=$(curl -s -w '\n%{http_code}' -X POST "http://127.0.0.1:$HTTP_PORT/json" \
    -d '{"domain":"demo","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}')
code=$(tail -n 1 <<<"$json")
sed -e '$d' -e 's/^/  /' <<<"$json"
echo "  HTTP $code"
[ "$code" = 429 ] || fail "alice's /json call answered HTTP $code, expected 429"
echo
echo "A token quota: carol may use 1000 LLM tokens per minute. Each answer reports what it"
echo "used (x-tokens-used); Envoy charges it after the answer, even past what is left."
tokens_charged() { # wait until redis-rl-envoy has counted $1 tokens of carol's
    for _ in $(seq 1 100); do
        n=$(curl -s "http://127.0.0.1:$METRICS_PORT/metrics" \
            | awk '/^ratelimit_service_rate_limit_total_hits\{domain="demo",key1="llm_user"/ {print $2}')
        [ "${n:-0}" = "$1" ] && return 0; sleep 0.1
    done
    # RL_ON_ERROR=open lets a request through when Redis errs, so a module older than
    # RL.CHARGE shows here, as charges that never count.
    fail "redis-rl-envoy has not counted $1 tokens for carol (it counted ${n:-none}); is \$MODULE older than RL.CHARGE?"
}
total=0
i=0
for used in 400 400 400 1; do
    i=$((i + 1))
    echo "\$ curl -H 'x-user: carol' -H 'x-tokens: $used' http://127.0.0.1:$LISTEN_PORT/v1/chat"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: carol' -H "x-tokens: $used" \
        "http://127.0.0.1:$LISTEN_PORT/v1/chat")
    # 1000 tokens: the first three pass (the third goes into debt, 1200 of 1000 charged
    # after its answer), and the fourth is refused until the debt is repaid.
    if [ "$i" -le 3 ]; then
        [ "$code" = 200 ] || fail "carol's request $i answered HTTP $code, expected 200"
        total=$((total + used))
        tokens_charged "$total"
        echo "  HTTP $code, the answer used $used tokens ($total charged this minute)"
    else
        [ "$code" = 429 ] || fail "carol's request $i answered HTTP $code, expected 429 (the quota is spent)"
        echo "  HTTP $code: the quota is spent (1200 of 1000 used), refused until repaid"
    fi
done
echo
echo "Stopping Redis, redis-rl-envoy, the upstream and Envoy."
