#!/usr/bin/env bash
# make image-test: the images together, as CI runs them. For each server image (Redis 7, then
# Valkey 9): the server container and the redis-rl-envoy container on the host's network on
# free ports, Envoy 1.40 on the host in front of an upstream (python3 -m http.server), the
# config of examples/envoy mounted where the peer's image reads it, laid out as a ConfigMap
# volume. The service image's CA bundle is checked first. A burst of 6 requests from
# one user under a limit of 5 per minute must give 200 five times, then 429. Everything stops
# at the end, pass or fail. podman missing is a failure, never a skip.
#
# Environment (mk/image.mk sets it): ENVOY (the envoy binary).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=deploy/images/podman.sh
. deploy/images/podman.sh
: "${ENVOY:?ENVOY (make deps-envoy) is not set}"
need_podman image-test

RUN="$(mktemp -d)"
PIDS=()
CONTAINERS=()
stop() {
    local status=$?
    if [ "$status" != 0 ]; then
        for c in "${CONTAINERS[@]}"; do
            echo "--- podman logs $c" >&2
            "${PODMAN[@]}" logs "$c" 2>&1 | tail -n 20 >&2 || true
        done
        for f in "$RUN"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
    fi
    for c in "${CONTAINERS[@]}"; do "${PODMAN[@]}" rm -f -t 5 "$c" >/dev/null 2>&1 || true; done
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$RUN"
}
trap stop EXIT
fail() { echo "image-test: $*" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # url, what
    for _ in $(seq 1 300); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
    fail "$2 did not come up"
}
# A container's name says which run it belongs to, so two runs never collide. No --rm: a
# container that exits at once keeps its logs for the failure report; stop() removes it.
# Not called in $(...): CONTAINERS must grow in this shell for stop() to see it. The name is
# left in $CONTAINER, and recorded before the start so a failed start is removed too.
run_container() { # name, podman run arguments...
    CONTAINER="redis-rl-test-$$-$1"
    shift
    CONTAINERS+=("$CONTAINER")
    "${PODMAN[@]}" run -d --name "$CONTAINER" "${LIMITS[@]}" "$@" >/dev/null
}

for image in "$ENVOY_IMAGE" "$REDIS_IMAGE" "$VALKEY_IMAGE"; do
    "${PODMAN[@]}" image exists "$image" || fail "no image $image (make image)"
done
# Neither the service nor the server runs as root: the uid each container's process has.
check_uid() { # container, image, uid
    local uid
    uid=$("${PODMAN[@]}" top "$1" huser | sed -n 2p | tr -d ' ')
    [ "$uid" = "$3" ] || fail "$2 runs as uid '$uid', not $3"
}

# The config as kubelet mounts a ConfigMap: each key is a symlink through `..data` to a dated
# directory holding the real files. Every file under config/ is read, so the dated copy is
# a second definition of each domain unless RUNTIME_IGNOREDOTFILES=true skips it, as in
# deploy/kubernetes/ratelimit.yaml.
CONFIGMAP="$RUN/configmap"
dated="..2026_01_02_03_04_05.000000001"
mkdir -p "$CONFIGMAP/$dated"
cp examples/envoy/config/* "$CONFIGMAP/$dated/"
ln -s "$dated" "$CONFIGMAP/..data"
for f in examples/envoy/config/*; do ln -s "..data/$(basename "$f")" "$CONFIGMAP/$(basename "$f")"; done
chmod -R a+rX "$CONFIGMAP"

# Debian's CA bundle, for REDIS_TLS and xDS TLS against the system roots: present, a regular
# file of certificates, readable by the service's uid (there is no shell in the image, so
# `podman cp` lists it with its mode).
probe="redis-rl-test-$$-cabundle"
CONTAINERS+=("$probe")
"${PODMAN[@]}" create --name "$probe" "$ENVOY_IMAGE" >/dev/null
entry=$("${PODMAN[@]}" cp "$probe:/etc/ssl/certs/ca-certificates.crt" - | tar -tvf -)
[[ "$entry" == -r??r??r--* ]] || fail "the CA bundle is not a regular file every user may read: $entry"
count=$("${PODMAN[@]}" cp "$probe:/etc/ssl/certs/ca-certificates.crt" - | tar -xOf - | grep -c 'BEGIN CERTIFICATE' || true)
[ "$count" -gt 50 ] || fail "the CA bundle holds $count certificates"
echo "=== $ENVOY_IMAGE: /etc/ssl/certs/ca-certificates.crt, $count certificates, ${entry%% *}"
"${PODMAN[@]}" rm -f "$probe" >/dev/null

# Envoy and the upstream stay up across both servers; each server gets its own service.
UPSTREAM_PORT=$(free_port) LISTEN_PORT=$(free_port) ADMIN_PORT=$(free_port) GRPC_PORT=$(free_port)
mkdir -p "$RUN/www" && echo "hello from the upstream" >"$RUN/www/index.html"
python3 -m http.server "$UPSTREAM_PORT" --bind 127.0.0.1 --directory "$RUN/www" >"$RUN/upstream.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$UPSTREAM_PORT/" "the upstream"
sed -e "s/@ADMIN_PORT@/$ADMIN_PORT/" -e "s/@LISTEN_PORT@/$LISTEN_PORT/" \
    -e "s/@UPSTREAM_PORT@/$UPSTREAM_PORT/" -e "s/@GRPC_PORT@/$GRPC_PORT/" \
    examples/envoy/envoy.yaml >"$RUN/envoy.yaml"
"$ENVOY" -c "$RUN/envoy.yaml" --use-dynamic-base-id --log-level warn >"$RUN/envoy.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$ADMIN_PORT/ready" "Envoy"

passed=0
for server in "$REDIS_IMAGE" "$VALKEY_IMAGE"; do
    echo "=== $server and $ENVOY_IMAGE behind Envoy $("$ENVOY" --version | grep -o '[0-9]*\.[0-9]*\.[0-9]*' | head -n1)"
    REDIS_PORT=$(free_port) HTTP_PORT=$(free_port)
    run_container "server-$REDIS_PORT" "$server" --port "$REDIS_PORT" --bind 127.0.0.1
    redis=$CONTAINER
    for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis-cli -p "$REDIS_PORT" MODULE LIST | grep -qx rl || fail "$server: the module is not loaded"
    check_uid "$redis" "$server" 999
    echo "  $(redis-cli -p "$REDIS_PORT" INFO server | grep -E '^(redis|valkey)_version' | tail -n 1 | tr -d '\r')"

    # The peer's layout: the YAML under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, read-only,
    # laid out as a ConfigMap volume, with the variables the peer's Deployments set (the
    # image sets RUNTIME_ROOT and RUNTIME_SUBDIRECTORY to the same values). Redis by name, not address: the image has no libnss_* modules, and
    # must resolve anyway.
    run_container "service-$HTTP_PORT" \
        -v "$CONFIGMAP:/data/ratelimit/config:ro" \
        -e RUNTIME_ROOT=/data -e RUNTIME_SUBDIRECTORY=ratelimit -e RUNTIME_IGNOREDOTFILES=true \
        -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL="localhost:$REDIS_PORT" \
        -e HOST=127.0.0.1 -e PORT="$HTTP_PORT" -e GRPC_HOST=127.0.0.1 -e GRPC_PORT="$GRPC_PORT" \
        "$ENVOY_IMAGE"
    service=$CONTAINER
    wait_for "http://127.0.0.1:$HTTP_PORT/healthcheck" "$ENVOY_IMAGE"

    # Once: the layout is really a ConfigMap's. Without RUNTIME_IGNOREDOTFILES the dated copy
    # is read too, and the service refuses the second definition of the domain and exits.
    if [ "$passed" = 0 ]; then
        run_container "dotfiles-$HTTP_PORT" \
            -v "$CONFIGMAP:/data/ratelimit/config:ro" \
            -e RUNTIME_ROOT=/data -e RUNTIME_SUBDIRECTORY=ratelimit \
            -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL="localhost:$REDIS_PORT" \
            -e HOST=127.0.0.1 -e PORT="$(free_port)" -e GRPC_HOST=127.0.0.1 -e GRPC_PORT="$(free_port)" \
            "$ENVOY_IMAGE"
        status=$(timeout 30 "${PODMAN[@]}" wait "$CONTAINER") || fail "without RUNTIME_IGNOREDOTFILES the service did not exit"
        logs=$("${PODMAN[@]}" logs "$CONTAINER" 2>&1)
        [ "$status" != 0 ] && grep -q 'duplicate domain' <<<"$logs" \
            || fail "without RUNTIME_IGNOREDOTFILES the ConfigMap layout was not refused as a duplicate domain (exit $status)"
        echo "  without RUNTIME_IGNOREDOTFILES: refused, a duplicate domain (exit $status)"
        "${PODMAN[@]}" rm -f "$CONTAINER" >/dev/null
    fi
    check_uid "$service" "$ENVOY_IMAGE" 65532

    # Envoy's connection may still point at the previous round's service: wait until a
    # request through Envoy carries the service's x-ratelimit-limit (another user's bucket).
    for _ in $(seq 1 100); do
        curl -s -o /dev/null -D - -H 'x-user: warmup' "http://127.0.0.1:$LISTEN_PORT/" \
            | grep -qi '^x-ratelimit-limit' && break
        sleep 0.1
    done

    # alice may make 5 requests a minute (examples/envoy/config): 5 pass, the 6th is refused.
    # A fresh server each round, so the bucket starts full. failure_mode_deny is false in
    # examples/envoy/envoy.yaml, so a 429 can only come from the service's decision.
    codes=""
    for _ in 1 2 3 4 5 6; do
        codes="$codes $(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: alice' "http://127.0.0.1:$LISTEN_PORT/")"
    done
    echo "  a burst of 6 from alice (5 per minute):$codes"
    [ "$codes" = " 200 200 200 200 200 429" ] || fail "$server: expected 200 x5 then 429, got$codes"
    [ "$(redis-cli -p "$REDIS_PORT" --scan | wc -l)" -gt 0 ] || fail "$server: no bucket was written"

    "${PODMAN[@]}" rm -f -t 5 "$service" "$redis" >/dev/null
    passed=$((passed + 1))
done
# docs/deploy.md's podman commands, as written: its first sh block under "Running them with
# podman", run from the repository's root. Only what the doc calls examples changes: the
# ports on its REDIS_PORT=… line become free ones, and the container names become this run's
# (so stop() removes them and parallel runs do not collide). It must print OK, then a burst
# of 5 × 200 and a 429.
deploy_block=$(awk '/^## Running them with podman/ {s=1} s && /^```sh$/ {b=1; next} b && /^```$/ {exit} b' docs/deploy.md)
grep -q '^REDIS_PORT=[0-9]* HTTP_PORT=[0-9]* GRPC_PORT=[0-9]* DEBUG_PORT=[0-9]*$' <<<"$deploy_block" \
    || fail "docs/deploy.md's podman block has no REDIS_PORT=… HTTP_PORT=… GRPC_PORT=… DEBUG_PORT=… line"
doc_redis="redis-rl-test-$$-doc-redis" doc_envoy="redis-rl-test-$$-doc-envoy"
CONTAINERS+=("$doc_redis" "$doc_envoy")
deploy_block=$(sed -e "s/^REDIS_PORT=[0-9]* HTTP_PORT=[0-9]* GRPC_PORT=[0-9]* DEBUG_PORT=[0-9]*$/REDIS_PORT=$(free_port) HTTP_PORT=$(free_port) GRPC_PORT=$(free_port) DEBUG_PORT=$(free_port)/" \
    -e "s/--name rl-redis /--name $doc_redis /" -e "s/--name rl-envoy /--name $doc_envoy /" \
    -e "s#localhost/redis-rl-envoy:latest#$ENVOY_IMAGE#" <<<"$deploy_block")
echo "=== docs/deploy.md's podman commands, as written"
out=$(timeout 60 bash -e <<<"$deploy_block") || fail "docs/deploy.md's podman commands failed: $out"
printf '%s\n' "$out" | sed 's/^/  /'
[ "$(printf '%s\n' "$out" | tail -n 2 | head -n 1)" = "OK" ] || fail "docs/deploy.md: /healthcheck did not answer OK"
[ "$(printf '%s\n' "$out" | tail -n 1)" = "200 200 200 200 200 429 " ] \
    || fail "docs/deploy.md's burst did not limit: $(printf '%s\n' "$out" | tail -n 1)"
# The two commands the text after the block gives, as written but for the container names:
# the service's log (it must not say the rules are missing), then the removal.
doc_inline() { # the command in docs/deploy.md's `...` that starts with $1
    grep -o "\`$1[^\`]*\`" docs/deploy.md | head -n 1 | tr -d '\`'
}
rename() { sed -e "s/rl-envoy/$doc_envoy/" -e "s/rl-redis/$doc_redis/"; }
logs_cmd=$(doc_inline "podman logs " | rename)
rm_cmd=$(doc_inline '$P rm ' | rename)
[ -n "$logs_cmd" ] && [ -n "$rm_cmd" ] || fail "docs/deploy.md names no podman logs or \$P rm command"
logs=$(P="${PODMAN[*]}" bash -ec "$logs_cmd" 2>&1) || fail "docs/deploy.md: $logs_cmd failed: $logs"
if grep -q "limits nothing" <<<"$logs"; then fail "docs/deploy.md's service found no rules: $logs"; fi
P="${PODMAN[*]}" bash -ec "$rm_cmd" >/dev/null || fail "docs/deploy.md: $rm_cmd failed"
for c in "$doc_envoy" "$doc_redis"; do
    if "${PODMAN[@]}" container exists "$c"; then fail "docs/deploy.md: $rm_cmd left $c"; fi
done
passed=$((passed + 1))

echo "image-test: $passed passed, 0 failed"
