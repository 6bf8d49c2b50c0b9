#!/usr/bin/env bash
# A local Redis Cluster for trying the module: 3 masters and 3 replicas on 127.0.0.1, each
# with the module loaded, daemonized, with its data and log under .run/cluster/<port>/.
#
#   scripts/cluster.sh start   # what `make cluster` runs
#   scripts/cluster.sh stop    # what `make cluster-stop` runs
#
# Environment:
#   CLUSTER_PORT  first port (default 30001); the nodes use CLUSTER_PORT .. CLUSTER_PORT+5,
#                 and each node's cluster bus listens on its port + 10000
#   REDIS_SERVER  server binary (default redis-server; a valkey-server works too)
#   REDIS_CLI     client binary (default valkey-cli for a Valkey server if installed, else
#                 redis-cli, which also drives Valkey)
#   MODULE        the module (default target/release/libredis_rl.so)

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN_DIR="$ROOT/.run/cluster"
CLUSTER_PORT="${CLUSTER_PORT:-30001}"
REDIS_SERVER="${REDIS_SERVER:-redis-server}"
MODULE="${MODULE:-$ROOT/target/release/libredis_rl.so}"
NODES=6
# How long a node may take to answer PING, and the cluster to become ok (seconds).
DEADLINE=30

if [[ -z "${REDIS_CLI:-}" ]]; then
    REDIS_CLI=redis-cli
    if [[ "$(basename "$REDIS_SERVER")" == valkey* ]]; then
        beside="$(dirname "$(command -v "$REDIS_SERVER" || echo "$REDIS_SERVER")")/valkey-cli"
        if [[ -x "$beside" ]]; then
            REDIS_CLI="$beside"
        elif command -v valkey-cli >/dev/null; then
            REDIS_CLI=valkey-cli
        fi
    fi
fi

die() {
    echo "cluster: $*" >&2
    exit 1
}

ports() {
    seq "$CLUSTER_PORT" $((CLUSTER_PORT + NODES - 1))
}

cli() {
    local port=$1
    shift
    "$REDIS_CLI" -h 127.0.0.1 -p "$port" "$@"
}

# Whether something accepts connections on 127.0.0.1:$1.
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Prints the end of each node's log (after a failure).
show_logs() {
    local log
    for log in "$RUN_DIR"/*/redis.log; do
        [[ -f "$log" ]] || continue
        echo "--- $log (last 20 lines)" >&2
        tail -n 20 "$log" >&2
    done
}

# Whether the node on $1 has written its pid file and is gone since.
exited() {
    local pidfile="$RUN_DIR/$1/redis.pid"
    [[ -f "$pidfile" ]] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# Waits until `check <port>` succeeds for every node, or fails after DEADLINE seconds.
wait_all() {
    local what=$1 check=$2 port
    local end=$((SECONDS + DEADLINE))
    for port in $(ports); do
        until "$check" "$port"; do
            if exited "$port"; then
                show_logs
                die "node $port exited (logs above)"
            fi
            if ((SECONDS >= end)); then
                show_logs
                die "node $port: $what not reached within ${DEADLINE}s (logs above)"
            fi
            sleep 0.2
        done
    done
}

answers_ping() {
    [[ "$(cli "$1" PING 2>/dev/null)" == PONG ]]
}

# cluster_state:ok, every replica known as one (gossip has spread the roles), and for a
# replica a live link to its master that is not mid-sync.
cluster_ok() {
    local info replicas
    info="$(cli "$1" CLUSTER INFO 2>/dev/null)" || return 1
    [[ "$info" == *cluster_state:ok* ]] || return 1
    replicas="$(cli "$1" CLUSTER NODES 2>/dev/null | awk '$3 ~ /slave|replica/' | wc -l)" || return 1
    ((replicas == NODES / 2)) || return 1
    info="$(cli "$1" INFO replication 2>/dev/null)" || return 1
    [[ "$info" == *role:master* ]] && return 0
    [[ "$info" == *master_link_status:up* && "$info" == *master_sync_in_progress:0* ]]
}

start() {
    [[ -f "$MODULE" ]] || die "no module at $MODULE (run: make build)"
    command -v "$REDIS_SERVER" >/dev/null || die "no server binary '$REDIS_SERVER' (set REDIS_SERVER)"
    command -v "$REDIS_CLI" >/dev/null || die "no client binary '$REDIS_CLI' (install redis-tools, or set REDIS_CLI)"
    if [[ -d "$RUN_DIR" ]]; then
        die "a cluster already exists in $RUN_DIR: stop it with 'make cluster-stop' first"
    fi
    local port
    for port in $(ports); do
        if listening "$port" || listening $((port + 10000)); then
            die "port $port or its bus port $((port + 10000)) is in use: pick other ports with CLUSTER_PORT=<first port>"
        fi
    done

    # From here on, a failure (or Ctrl-C) stops whatever was started.
    CLUSTER_UP=0
    trap '[[ $CLUSTER_UP == 1 ]] || { echo "cluster: start failed; stopping the nodes" >&2; stop >/dev/null 2>&1 || true; }' EXIT

    local dir
    for port in $(ports); do
        dir="$RUN_DIR/$port"
        mkdir -p "$dir"
        "$REDIS_SERVER" \
            --port "$port" \
            --bind 127.0.0.1 \
            --daemonize yes \
            --dir "$dir" \
            --logfile "$dir/redis.log" \
            --pidfile "$dir/redis.pid" \
            --cluster-enabled yes \
            --cluster-config-file nodes.conf \
            --cluster-node-timeout 5000 \
            --appendonly no \
            --save "" \
            --repl-diskless-sync-delay 0 \
            --loadmodule "$MODULE" >/dev/null
    done
    wait_all "PING" answers_ping

    local addresses=()
    for port in $(ports); do
        addresses+=("127.0.0.1:$port")
    done
    "$REDIS_CLI" --cluster create "${addresses[@]}" --cluster-replicas 1 --cluster-yes
    wait_all "cluster_state:ok and replica links up" cluster_ok
    CLUSTER_UP=1

    echo
    echo "Cluster up: $NODES nodes on 127.0.0.1:$CLUSTER_PORT-$((CLUSTER_PORT + NODES - 1)), data and logs in $RUN_DIR"
    cli "$CLUSTER_PORT" CLUSTER NODES | awk '
        { split($2, a, "@"); addr[$1] = a[1]; flags[$1] = $3; master[$1] = $4; slots[$1] = $9 }
        END {
            for (id in addr)
                if (flags[id] ~ /master/) print "  " addr[id] "  master, slots " slots[id]
                else print "  " addr[id] "  replica of " addr[master[id]]
        }' | sort
    echo
    echo "Connect with:  $REDIS_CLI -c -p $CLUSTER_PORT"
    echo "Try:           RL.ACQUIRE user:42 5 10"
    echo "Stop with:     make cluster-stop"
}

stop() {
    if [[ ! -d "$RUN_DIR" ]]; then
        echo "cluster: nothing to stop ($RUN_DIR does not exist)"
        return 0
    fi
    local dir port pid end
    for dir in "$RUN_DIR"/*/; do
        port="$(basename "$dir")"
        [[ "$port" =~ ^[0-9]+$ ]] || continue
        pid=""
        [[ -f "$dir/redis.pid" ]] && pid="$(cat "$dir/redis.pid")"
        cli "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
        # SHUTDOWN closes the connection without a reply; wait for the process to be gone.
        if [[ -n "$pid" ]]; then
            end=$((SECONDS + DEADLINE))
            while kill -0 "$pid" 2>/dev/null; do
                if ((SECONDS >= end)); then
                    # Only if the pid is still that node (its title names the port).
                    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q ":$port"; then
                        echo "cluster: node $port (pid $pid) did not exit; killing it" >&2
                        kill -9 "$pid" 2>/dev/null || true
                    fi
                    break
                fi
                sleep 0.1
            done
        fi
        echo "stopped node $port"
    done
    rm -rf "$RUN_DIR"
    echo "cluster stopped; removed $RUN_DIR"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
