#!/usr/bin/env bash
# Instructions executed inside Redis's call() per command, under callgrind: a count that does
# not move with the machine's load, unlike server µs. Usage (make bench-instructions):
#   bench/instructions.sh MODULE.so COMMAND ARGS...   (redis-benchmark syntax, __rand_int__ ok)
#   PREFILL="COMMAND ARGS..." runs one command first, uncounted (the hot key of a denial).
#   LOAD="FILE..." loads Lua files first: SCRIPT LOAD (EVALSHA <sha1sum of the file>), or
#   FUNCTION LOAD for a library (a first line starting with #!lua, for FCALL).
#   COMMAND ARGS... + COMMAND2 ARGS2...: a pair, the second on the first's key (a lease taken
#   then released): N pairs pipelined from Python, __rand_int__ the pair's number (a new key
#   each), and the count is per pair.
#   An argument hex:<hex digits> is those bytes (the fallback's packed numbers, which hold NUL
#   bytes that neither redis-benchmark nor redis-cli can send): such a command, its check and
#   its PREFILL are sent from Python, N calls 16 a round trip on keys drawn from 100,000 as
#   redis-benchmark -r draws them.
# Prints "<command>  <Ir per call>". Needs valgrind (callgrind_annotate) and redis-benchmark.
set -euo pipefail
shopt -s extglob
N=${N:-20000}
# Keys drawn from KEYSPACE (redis-benchmark's -r): 100,000 by default, where 20,000 calls mostly
# make new keys; a small KEYSPACE counts the path that updates a key.
KEYSPACE=${KEYSPACE:-100000}
module=$1; shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Only call() and what it calls is counted: the command's own work, as INFO commandstats times it.
valgrind --tool=callgrind --collect-atstart=no --toggle-collect=call \
    --callgrind-out-file="$dir/cg.out" redis-server --port "$port" --bind 127.0.0.1 \
    --save "" --appendonly no --dir "$dir" --loadmodule "$module" >/dev/null 2>&1 &
server=$!
for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.3; done
for file in ${LOAD:-}; do
    if head -n 1 "$file" | grep -q '^#!lua'; then
        redis-cli -p "$port" -x FUNCTION LOAD REPLACE <"$file" >/dev/null
    else
        redis-cli -p "$port" -x SCRIPT LOAD <"$file" >/dev/null
    fi
done
case " $* ${PREFILL:-} " in
*" hex:"*)
    # Binary arguments: the check, the PREFILL and the N calls from Python.
    python3 - "$port" "$N" "$KEYSPACE" "${PREFILL:-}" "${EXPECT_DENIED:-}" "$@" <<'PY'
import random, socket, sys
port, n, keyspace, prefill, expect_denied, words = (int(sys.argv[1]), int(sys.argv[2]),
                                                    int(sys.argv[3]), sys.argv[4], sys.argv[5],
                                                    sys.argv[6:])
if "+" in words:
    sys.exit("instructions.sh: a pair (+) with hex: arguments is not supported")
def word(w):
    return bytes.fromhex(w[4:]) if w.startswith("hex:") else w.encode()
def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
sock = socket.create_connection(("127.0.0.1", port))
f = sock.makefile("rb")
def reply():
    line = f.readline()
    if line[:1] == b"-":
        sys.exit("%s answers an error: %r" % (" ".join(words), line))
    if line[:1] == b"$" and int(line[1:]) >= 0:
        return f.read(int(line[1:]) + 2)[:-2]
    if line[:1] == b"*":
        return [reply() for _ in range(int(line[1:]))]
    return line[1:-2]
if prefill:
    sock.sendall(encode([word(w) for w in prefill.split()]))
    reply()
command = [word(w) for w in words]
def call(key):
    return encode([a.replace(b"__rand_int__", key) for a in command])
sock.sendall(call(b"1"))
first = reply()
if isinstance(first, bytes) and len(first) == 32:
    # The script's short form answers its four numbers packed: four little-endian doubles.
    import struct
    first = [b"%d" % x for x in struct.unpack("<4d", first)]
# A denial must be one: the first integer is 1 when it takes.
if expect_denied and (not isinstance(first, list) or first[0] != b"0"):
    sys.exit("%s was not denied: %r" % (" ".join(words), first))
for start in range(0, n, 16):
    batch = range(start, min(n, start + 16))
    sock.sendall(b"".join(call(b"%012d" % random.randrange(keyspace)) for _ in batch))
    for _ in batch:
        reply()
PY
    ;;
*)
    if [ -n "${PREFILL:-}" ]; then
        # shellcheck disable=SC2086 # PREFILL is a command line, split into its words
        redis-cli -p "$port" $PREFILL >/dev/null
    fi
    first=()
    for word in "$@"; do [ "$word" = + ] && break; first+=("$word"); done
    reply=$(redis-cli -p "$port" "${first[@]//__rand_int__/1}")
    case "$reply" in ERR*|WRONGTYPE*|NOSCRIPT*) echo "$* answers an error: $reply" >&2; exit 1;; esac
    # A denial must be one: RL.ACQUIRE's first integer is 1 when it takes.
    if [ -n "${EXPECT_DENIED:-}" ] && [ "$(printf '%s' "$reply" | head -n 1)" != 0 ]; then
        echo "$* was not denied: $reply" >&2; exit 1
    fi
    case " $* " in
    *" + "*)
        # A pair: the first command, then the second, on new keys, 16 pairs a round trip.
        python3 - "$port" "$N" "$@" <<'PY' >/dev/null
import socket, sys
port, n, words = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
split = words.index("+")
first, second = words[:split], words[split + 1:]
def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
sock = socket.create_connection(("127.0.0.1", port))
f = sock.makefile("rb")
def reply():
    line = f.readline()
    if line[:1] == b"-":
        sys.exit("error reply: %r" % line)
    if line[:1] == b"$" and int(line[1:]) >= 0:
        f.read(int(line[1:]) + 2)
    if line[:1] == b"*":
        for _ in range(int(line[1:])):
            reply()
for start in range(0, n, 16):
    batch = range(start, min(n, start + 16))
    sock.sendall(b"".join(encode([w.replace("__rand_int__", "p%d" % i) for w in c])
                          for i in batch for c in (first, second)))
    for _ in range(2 * len(batch)):
        reply()
PY
        ;;
    *)
        redis-benchmark -p "$port" -n "$N" -c 1 -P 16 -r "$KEYSPACE" "$@" >/dev/null
        ;;
    esac
    ;;
esac
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$server" 2>/dev/null || true
callgrind_annotate "$dir/cg.out" >"$dir/annotated.txt"
# ANNOTATED=FILE keeps the per-function counts there (callgrind_annotate --inclusive=yes), and
# callgrind's own output in FILE.out (callgrind_annotate --tree=caller FILE.out, say).
if [ -n "${ANNOTATED:-}" ]; then
    callgrind_annotate --inclusive=yes "$dir/cg.out" >"$ANNOTATED"
    cp "$dir/cg.out" "$ANNOTATED.out"
fi
total=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }' "$dir/annotated.txt")
# N benchmarked calls, plus the check above and the SHUTDOWN. Packed numbers show as <packed>.
label="${*//hex:*([0-9a-f])/<packed>}"
[ "$KEYSPACE" = 100000 ] || label="$label [$KEYSPACE keys]"
echo "$label $total $((N + 2))" | awk '{n = $NF; t = $(NF-1); $NF = ""; $(NF-1) = ""; printf "%-55s %7.0f Ir/call\n", $0, t / n}'
