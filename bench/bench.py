#!/usr/bin/env python3
"""The `make bench` driver: RL.ACQUIRE against the classic Lua script and plain commands.

Starts its own redis-server (the release module loaded, no persistence, a free port, a temp
dir) pinned to one CPU, drives it with redis-benchmark pinned to the other (the fallback's
rows from Python on that CPU: their packed numbers are bytes redis-benchmark cannot send), and
writes bench/results.md and bench/chart.svg. Standard library only, so it runs on a fresh
machine.

What it measures, per workload x keyspace (one hot key, or 100,000 random keys) x pipeline
(-P 1, -P 16), with 50 clients, as the median of interleaved rounds:
  - req/s, p50 and p99 latency as redis-benchmark reports them (--csv);
  - the server's microseconds per call of the benchmarked command (INFO commandstats);
and, once, the memory one bucket costs (growth of used_memory over 100,000 new keys).

Every benchmarked command is first sent once by hand and must not answer an error (an error
reply counts as a success for redis-benchmark), and every run must leave failed_calls,
rejected_calls and INFO errorstats at zero, so the bench fails loudly when a command rots.

Usage:
  python3 bench/bench.py            # the full run (several minutes); writes bench/results.md
  python3 bench/bench.py --smoke    # seconds: 1 round, tiny runs, output in a temp dir
  python3 bench/bench.py --help
"""

import argparse
import contextlib
import csv
import datetime
import fractions
import math
import os
import random
import re
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from xml.sax.saxutils import escape

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
DEFAULT_MODULE = os.path.join(REPO, "target", "release", "libredis_rl.so")
LUA_SCRIPT = os.path.join(BENCH_DIR, "token_bucket.lua")
# redis-rl's own fallback, the script every client library ships, and the Functions library
# made from it: what a client runs where the module is not loaded.
RL_SCRIPT = os.path.join(REPO, "clients", "lua", "rl.lua")
RL_FUNCTIONS = os.path.join(REPO, "clients", "lua", "rl_functions.lua")
PROFILE_MARKER = "<!-- profile -->"
PROFILE_PLACEHOLDER = "_Profiler findings go here; this driver keeps everything below the marker line._\n"

HOT_KEY = "b:hot"
RAND_KEY = "b:__rand_int__"
CLIENTS = 50
PIPELINES = (1, 16)
# Requests per run at each pipeline depth, before --requests-scale: about 2-4 s per run.
BASE_REQUESTS = {1: 200_000, 16: 1_000_000}

# Each limiter figure is taken at a rate whose token interval is a whole number of ns (10/s:
# the state stays inline in the value pointer) and at one whose is not (3/s: the exact state
# carries a fraction of a ns in a 16-byte allocation).
#
# Allowed path: each take costs 100 s of refill, so a bucket lives on between calls and
# random keys exercise the update path, as live buckets do; the capacity holds a 1e9 s refill,
# so no run can drain it (a million takes on the hot key owe 1e8 s), within the module's
# 100-year bound. (rate, capacity, cost)
# At 3/s the cost is not a multiple of 3, so every state has a fraction of a ns.
ALLOW = {"10": ("10", "1e10", "1000"), "3": ("3", "3e9", "301")}
# Denied path: the prefill takes the whole capacity, a million seconds of refill, and every
# benchmarked call asks for all of it again.
# 0.000001/s, denied only: the slowest rate, one token per 1e15 ns. A decimal, so its token
# interval is whole ns and the state inline (0.2.0 read the double just below 1e-6, whose
# fraction cost a denial 2.2-2.4 x HMGET); the denial budget holds at every rate measured.
DENY = {"10": ("10", "1e7", "1e7"), "3": ("3", "3000001", "3000001"),
        "0.000001": ("0.000001", "1", "1")}
# Memory test: one bucket per key at each rate, and the Lua hash at a rate at which a second
# call 1 ms later leaves a fractional token count (8.0000029999999995), as in real use.
# Each take is 1e5 s of refill, so the keys outlive the test. (rate, capacity, cost)
MEM = {"10": ("10", "1e10", "1000000"), "3": ("3", "3e9", "300001")}
MEM_RATE, MEM_CAPACITY = "0.003", "10"
# Tables: RL.HACQUIRE on one key holding TABLE_BUCKETS buckets (--table-buckets), the field
# being the key redis-benchmark would have used. The memory test spreads its buckets over
# TABLE_KEYS keys with 16-byte fields ("f:" + a 14-byte key name), as the budget names them.
TABLE_KEY = "tbl"
TABLE_KEYS = 256
FLOOR_VALUE = "1234567890123456789"  # 19 digits: what an 8-byte bucket would be as a string
HASH_TOKENS = "8.0000029999999995"  # a typical Lua-written token count, for HMGET's hash


class BenchError(Exception):
    """A failure that ends the run with a clear message and a non-zero exit."""


# --------------------------------------------------------------------------------------
# A minimal RESP2 client: enough for pipelined prefills, checks and INFO.


class ErrorReply(str):
    """An error reply (`-ERR ...`), returned as a value so pipelines can count them."""


def shown(command):
    """A command as text: a binary argument (the fallback's packed numbers) as <N bytes>."""
    return " ".join("<%d bytes>" % len(a) if isinstance(a, bytes) else str(a) for a in command)


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Conn:
    def __init__(self, port, timeout=60.0):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def close(self):
        try:
            self.reader.close()
            self.sock.close()
        except OSError:
            pass

    def read(self, raw=False):
        """One reply; a bulk string as text, or as bytes when `raw`."""
        line = self.reader.readline()
        if not line.endswith(b"\r\n"):
            raise BenchError("the server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ErrorReply(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            bulk = self.reader.read(size + 2)[:-2]
            return bulk if raw else bulk.decode(errors="replace")
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.read(raw) for _ in range(size)]
        raise BenchError("unexpected RESP reply: %r" % line)

    def call(self, *args, raw=False):
        """Sends one command; raises on an error reply. `raw`: bulk strings as bytes."""
        self.sock.sendall(encode(args))
        reply = self.read(raw)
        if isinstance(reply, ErrorReply):
            raise BenchError("%s answered an error: %s" % (" ".join(map(str, args)), reply))
        return reply

    def pipeline(self, commands, batch=1000, raw=False):
        """Sends commands in pipelined batches; yields every reply, errors included. `raw`:
        bulk strings as bytes."""
        chunk = []
        for command in commands:
            chunk.append(command)
            if len(chunk) == batch:
                yield from self._flush(chunk, raw)
                chunk = []
        if chunk:
            yield from self._flush(chunk, raw)

    def _flush(self, chunk, raw=False):
        self.sock.sendall(b"".join(encode(c) for c in chunk))
        return [self.read(raw) for _ in chunk]

    def run_all(self, commands, what):
        """Pipelines commands and fails on the first error reply. Returns the replies' count."""
        count = 0
        for reply in self.pipeline(commands):
            if isinstance(reply, ErrorReply):
                raise BenchError("%s: a command answered an error: %s" % (what, reply))
            count += 1
        return count

    def info(self, section):
        fields = {}
        for line in self.call("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                name, value = line.split(":", 1)
                fields[name] = value
        return fields


def parse_stat(value):
    """`calls=3,usec=5,usec_per_call=1.67,...` -> {'calls': 3.0, ...}"""
    return {k: float(v) for k, v in (item.split("=", 1) for item in value.split(","))}


# --------------------------------------------------------------------------------------
# The server and the client processes.


def die_with_parent():
    """Runs in the child before exec: SIGKILL it if this driver dies without cleaning up."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux, or no libc: the try/finally still stops the server
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """redis-server with the module, pinned to one CPU. stop() kills it and waits."""

    def __init__(self, binary, module, cpu, workdir, extra=()):
        self.binary, self.module, self.cpu, self.workdir = binary, module, cpu, workdir
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.log = os.path.join(workdir, "redis.log")

    def start(self):
        for _ in range(5):  # a port found free can be taken before the server binds it
            self.port = free_port()
            cmd = ["taskset", "-c", str(self.cpu), self.binary,
                   "--port", str(self.port), "--bind", "127.0.0.1",
                   "--save", "", "--appendonly", "no",
                   "--dir", self.workdir, "--logfile", self.log,
                   *self.extra, "--loadmodule", self.module]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    conn = Conn(self.port)
                    # Another process's server can hold a port found free (ours then exits on
                    # "Address already in use"): only our own child counts. taskset execs the
                    # server, so the child's pid is the server's.
                    if (conn.call("PING") == "PONG"
                            and conn.info("server").get("process_id") == str(self.proc.pid)):
                        return conn
                    conn.close()
                except (OSError, BenchError):
                    time.sleep(0.05)
            self.stop()
            if "Address already in use" not in self.log_tail():
                break
        raise BenchError("redis-server did not start (command: %s)\n--- %s (tail) ---\n%s"
                         % (" ".join(cmd), self.log, self.log_tail()))

    def log_tail(self, lines=20):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def running_server(binary, module, cpu, extra=()):
    """A Server (not yet started) in a temp dir of its own: stopped after, its dir removed,
    or its log kept and named if the run failed."""
    workdir = tempfile.mkdtemp(prefix="redis-rl-bench-server-")
    server = Server(binary, os.path.abspath(module), cpu, workdir, extra)
    keep_log = False
    try:
        yield server
    except (BenchError, OSError):
        keep_log = True
        raise
    finally:
        server.stop()
        if keep_log:
            print("redis-server log kept in %s" % server.log, file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_benchmark(opts, port, n, pipeline, command, keyspace):
    cmd = ["taskset", "-c", str(opts.client_cpu), opts.redis_benchmark,
           "-h", "127.0.0.1", "-p", str(port), "-c", str(CLIENTS), "-n", str(n),
           "-P", str(pipeline), "--csv"]
    if keyspace:
        cmd += ["-r", str(keyspace)]
    cmd += command
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=900)
    except subprocess.TimeoutExpired:
        raise BenchError("redis-benchmark ran for over 15 minutes: %s" % " ".join(cmd))
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise BenchError("redis-benchmark failed (exit %d): %s\n%s%s"
                         % (proc.returncode, " ".join(cmd), proc.stdout, proc.stderr))
    rows = list(csv.reader(line for line in proc.stdout.splitlines() if line.startswith('"')))
    for header, row in zip(rows, rows[1:]):
        if header and header[0] == "test":
            values = dict(zip(header, row))
            try:
                return {"rps": float(values["rps"]),
                        "p50": float(values["p50_latency_ms"]),
                        "p99": float(values["p99_latency_ms"]),
                        "wall": wall}
            except (KeyError, ValueError):
                break
    raise BenchError("could not parse redis-benchmark --csv output of: %s\n%s%s"
                     % (" ".join(cmd), proc.stdout, proc.stderr))


def reply_end(buf, at):
    """Where the RESP reply starting at `at` in buf ends, or -1 while it is incomplete."""
    line_end = buf.find(b"\r\n", at)
    if line_end < 0:
        return -1
    kind = buf[at:at + 1]
    if kind == b"-":
        raise BenchError("a benchmarked call answered an error: %s"
                         % buf[at + 1:line_end].decode(errors="replace"))
    if kind == b"$":
        size = int(buf[at + 1:line_end])
        end = line_end + 2 + (size + 2 if size >= 0 else 0)
        return end if end <= len(buf) else -1
    if kind == b"*":
        end = line_end + 2
        for _ in range(max(int(buf[at + 1:line_end]), 0)):
            end = reply_end(buf, end)
            if end < 0:
                return -1
        return end
    return line_end + 2


def run_python_benchmark(opts, port, n, pipeline, command, keyspace):
    """run_benchmark for a command with a binary argument (the fallback's packed numbers, NUL
    bytes and all), which redis-benchmark cannot send: its arguments are C strings, -x's too.
    The same run from Python on the client CPU: CLIENTS connections, `pipeline` calls a round
    trip each, __rand_int__ drawn as redis-benchmark draws it, and the same figures (req/s; p50
    and p99 of each call's round trip, which at -P 16 is its pipeline's). The server's µs per
    call, the figure the targets compare, does not depend on the client."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in command]

    def batch(size):
        out = []
        for _ in range(size):
            key = b"%012d" % random.randrange(keyspace) if keyspace else b"__rand_int__"
            out.append(encode([p.replace(b"__rand_int__", key) for p in parts]))
        return b"".join(out)

    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {opts.client_cpu})
    selector = selectors.DefaultSelector()
    socks = []
    try:
        latencies, sent = [], 0
        started = time.monotonic()
        for _ in range(min(CLIENTS, n)):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
            size = min(pipeline, n - sent)
            if size == 0:
                break
            state = {"buf": b"", "pending": size, "since": time.monotonic()}
            sock.sendall(batch(size))
            sent += size
            selector.register(sock, selectors.EVENT_READ, state)
        while selector.get_map():
            for item, _ in selector.select(timeout=60):
                sock, state = item.fileobj, item.data
                data = sock.recv(1 << 16)
                if not data:
                    raise BenchError("the server closed a benchmark connection")
                buf, at = state["buf"] + data, 0
                while state["pending"]:
                    end = reply_end(buf, at)
                    if end < 0:
                        break
                    at, state["pending"] = end, state["pending"] - 1
                state["buf"] = buf[at:]
                if state["pending"]:
                    continue
                now = time.monotonic()
                latencies.append(now - state["since"])
                size = min(pipeline, n - sent)
                if size == 0:
                    selector.unregister(sock)
                    continue
                state["pending"], state["since"] = size, now
                sock.sendall(batch(size))
                sent += size
        wall = time.monotonic() - started
    finally:
        os.sched_setaffinity(0, affinity)
        selector.close()
        for sock in socks:
            sock.close()
    latencies.sort()

    def percentile(q):
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return {"rps": n / wall, "p50": percentile(0.50), "p99": percentile(0.99), "wall": wall}


# --------------------------------------------------------------------------------------
# Workloads.


class Workload:
    """One benchmarked command. `args(key)` builds it; `stat` is its INFO commandstats name;
    `expect` is 'allowed' or 'denied' for the rate limiters (checked on the reply)."""

    def __init__(self, name, label, stat, args, prefill=None, expect=None, preload=None,
                 hot=True, python=False):
        self.name, self.label, self.stat = name, label, stat
        self.args, self.prefill, self.expect = args, prefill, expect
        # Whether it also runs on one hot key (else on random keys only).
        self.hot = hot
        # Whether it is sent by run_python_benchmark even when redis-benchmark could send it:
        # the classic script's twin of the fallback's rows, so the two are compared on the
        # same load from the same client.
        self.python = python
        # Commands run once per field of a loaded table before each run (tables only).
        self.preload = preload


def script_numbers(rate, capacity, cost):
    """The fallback's 10 numbers for an acquire (clients/lua/rl.lua's header): D, then T, the
    capacity's refill, the slack and the cost's refill as pairs q + r/D µs, and floor(capacity).
    Exact rationals, as the client libraries compute them (T's denominator is below 2^31 here)."""
    rate, capacity, cost = (fractions.Fraction(x) for x in (rate, capacity, cost))
    t_us = fractions.Fraction(10**6) / rate
    d = t_us.denominator

    def pair(x, rounding):
        return divmod(rounding(x * d), d)

    numbers = [d, *pair(t_us, math.ceil), *pair(capacity * t_us, math.floor),
               *pair((capacity - cost) * t_us, math.floor), *pair(cost * t_us, math.ceil),
               math.floor(capacity)]
    return [str(n) for n in numbers]


def script_packed(rate, capacity, cost):
    """script_numbers packed as the client libraries send them: one argument of 80 bytes, ten
    little-endian doubles (integers below 2^53, so exact)."""
    return struct.pack("<10d", *(int(n) for n in script_numbers(rate, capacity, cost)))


def workloads(sha, now_ms, rl_sha="rl_sha"):
    def rl(rate, capacity, cost):
        return lambda key: ["RL.ACQUIRE", key, rate, capacity, cost]

    def table(rate, capacity, cost):
        return lambda key: ["RL.HACQUIRE", TABLE_KEY, key, rate, capacity, cost]

    def lua(rate, capacity, cost):
        return lambda key: ["EVALSHA", sha, "1", key, rate, capacity, str(now_ms), cost]

    def script(rate, capacity, cost):
        # The short form the libraries send for a one-key acquire: the packed numbers, no mode.
        packed = script_packed(rate, capacity, cost)
        return lambda key: ["EVALSHA", rl_sha, "1", key, packed]

    def function(rate, capacity, cost):
        packed = script_packed(rate, capacity, cost)
        # rl_acquire_packed, which the libraries call for a one-key acquire (a packed reply).
        return lambda key: ["FCALL", "rl_acquire_packed", "1", key, packed]

    def hash_prefill(key):
        return ["HSET", key, "tokens", HASH_TOKENS, "ts", str(now_ms)]

    found = []
    for rate in ALLOW:
        found.append(Workload("rl_allowed_%s" % rate, "RL.ACQUIRE allowed %s/s" % rate,
                              "RL.ACQUIRE", rl(*ALLOW[rate]), expect="allowed"))
    for rate in DENY:
        rl_deny = rl(*DENY[rate])
        found.append(Workload("rl_denied_%s" % rate, "RL.ACQUIRE denied %s/s" % rate,
                              "RL.ACQUIRE", rl_deny, prefill=rl_deny, expect="denied"))
    for rate in ALLOW:
        allow, deny = table(*ALLOW[rate]), table(*DENY[rate])
        # The table holds every field of the keyspace before the run (taken from, or drained),
        # and the hot field too: a run updates live buckets in a loaded table.
        found += [
            Workload("table_allowed_%s" % rate, "RL.HACQUIRE allowed %s/s" % rate, "RL.HACQUIRE",
                     allow, prefill=allow, expect="allowed", preload=allow),
            Workload("table_denied_%s" % rate, "RL.HACQUIRE denied %s/s" % rate, "RL.HACQUIRE",
                     deny, prefill=deny, expect="denied", preload=deny),
        ]
    found += [
        Workload("lua_allowed", "Lua script allowed", "evalsha", lua(*ALLOW["10"]),
                 expect="allowed"),
        Workload("lua_denied", "Lua script denied", "evalsha", lua(*DENY["10"]),
                 prefill=lua(*DENY["10"]), expect="denied"),
        Workload("lua_allowed_3", "Lua script allowed 3/s", "evalsha", lua(*ALLOW["3"]),
                 expect="allowed", hot=False),
    ]
    # redis-rl's fallback on the same allowed path, random keys only: the script (EVALSHA) and
    # the Functions library (FCALL), beside the classic script and RL.ACQUIRE. Its packed
    # numbers are bytes, which only the Python driver sends, so the classic script runs once
    # more from that driver: the fallback's targets compare the two on the same load.
    for rate in ALLOW:
        found += [
            Workload("lua_py_allowed_%s" % rate, "Lua script allowed %s/s (Python driver)" % rate,
                     "evalsha", lua(*ALLOW[rate]), expect="allowed", hot=False, python=True),
            Workload("script_allowed_%s" % rate, "rl.lua EVALSHA allowed %s/s" % rate, "evalsha",
                     script(*ALLOW[rate]), expect="allowed", hot=False),
            Workload("function_allowed_%s" % rate, "rl_acquire_packed FCALL allowed %s/s" % rate,
                     "fcall", function(*ALLOW[rate]), expect="allowed", hot=False),
        ]
    found += [
        Workload("set_px", "SET PX (floor)", "set",
                 lambda key: ["SET", key, FLOOR_VALUE, "PX", "60000"]),
        Workload("hmget", "HMGET (floor)", "hmget",
                 lambda key: ["HMGET", key, "tokens", "ts"], prefill=hash_prefill),
        Workload("incr", "INCR (floor)", "incr", lambda key: ["INCR", key]),
    ]
    return found


def load_fallback(conn):
    """Loads redis-rl's fallback script and its Functions library; returns the script's SHA1.
    FLUSHALL keeps both (scripts and functions are not keys)."""
    with open(RL_SCRIPT, encoding="utf-8") as f:
        rl_sha = conn.call("SCRIPT", "LOAD", f.read())
    with open(RL_FUNCTIONS, encoding="utf-8") as f:
        conn.call("FUNCTION", "LOAD", "REPLACE", f.read())
    return rl_sha


def check_reply(workload, reply, command):
    """Fails on an error reply, or on a limiter reply of the wrong kind or shape."""
    text = shown(command)
    if isinstance(reply, ErrorReply):
        raise BenchError("`%s` answers an error: %s\n(redis-benchmark would count it as a "
                         "success, so the benchmark stops here)" % (text, reply))
    if workload.expect is None:
        return None
    if isinstance(reply, bytes) and len(reply) == 32:
        # The script's short form answers its four numbers packed: four little-endian doubles.
        reply = [int(x) for x in struct.unpack("<4d", reply)]
    if not (isinstance(reply, list) and len(reply) >= 2 and isinstance(reply[0], int)):
        raise BenchError("`%s` answered %r, not [allowed, remaining, ...]" % (text, reply))
    return reply[0] == 1


def rand_key(i):
    # redis-benchmark's __rand_int__: a 12-digit, zero-padded number below -r.
    return "b:%012d" % i


class Config:
    def __init__(self, workload, keyspace, pipeline):
        self.workload, self.keyspace, self.pipeline = workload, keyspace, pipeline

    @property
    def keys_label(self):
        return "random" if self.keyspace else "hot"

    def __str__(self):
        return "%-20s %-6s -P %-2d" % (self.workload.label, self.keys_label, self.pipeline)


def prepare(conn, config, sample_size, table_buckets=0):
    """FLUSHALL and RESETSTAT, load a table, prefill, check the path (allowed or denied),
    RESETSTAT."""
    wl = config.workload
    conn.call("FLUSHALL")
    conn.call("CONFIG", "RESETSTAT")
    if wl.preload:
        conn.run_all((wl.preload(rand_key(i)) for i in range(table_buckets)),
                     "table load for %s" % wl.label)
        if config.keyspace:
            # Every field of the keyspace was loaded already.
            config = Config(Workload(wl.name, wl.label, wl.stat, wl.args, expect=wl.expect,
                                     hot=wl.hot),
                            config.keyspace, config.pipeline)
            wl = config.workload
    if config.keyspace:
        keys = [rand_key(i) for i in range(config.keyspace)]
        sample = random.sample(keys, min(sample_size, len(keys)))
    else:
        keys = sample = [HOT_KEY]
    if wl.prefill:
        conn.run_all((wl.prefill(k) for k in keys), "prefill for %s" % wl.label)
    if wl.expect:
        # Sample the path before the run. Denials write nothing (RL) or rewrite the same state
        # (Lua); an allowed call takes 1 of 1e9 tokens. Either way the run is unaffected.
        commands = [wl.args(k) for k in sample]
        results = [check_reply(wl, r, c) for r, c in zip(conn.pipeline(commands, raw=True), commands)]
        want = wl.expect == "allowed"
        share = sum(1 for r in results if r == want) / len(results)
        if share < (1.0 if want else 0.99):
            raise BenchError("%s: only %.1f%% of %d sampled calls were %s"
                             % (config, 100 * share, len(results), wl.expect))
    conn.call("CONFIG", "RESETSTAT")


def collect_stats(conn, config, n):
    """The run's server-side µs per call; fails on any failed or rejected call or error."""
    wl = config.workload
    stats = conn.info("commandstats")
    entry = next((v for k, v in stats.items() if k.lower() == "cmdstat_" + wl.stat.lower()), None)
    if entry is None:
        raise BenchError("%s: no cmdstat_%s in INFO commandstats after the run" % (config, wl.stat))
    stat = parse_stat(entry)
    if stat.get("failed_calls", 0) or stat.get("rejected_calls", 0):
        raise BenchError("%s: cmdstat_%s reports failed or rejected calls: %s"
                         % (config, wl.stat, entry))
    errors = {k: v for k, v in conn.info("errorstats").items() if k.startswith("errorstat_")}
    if errors:
        raise BenchError("%s: the server counted error replies: %s" % (config, errors))
    if stat["calls"] < n:
        raise BenchError("%s: the server saw %d calls, redis-benchmark claims %d"
                         % (config, stat["calls"], n))
    return stat["usec"] / stat["calls"]


def post_check(conn, config):
    """After the run, the path must still be the same (no bucket ran dry, no denial lapsed)."""
    wl = config.workload
    if not wl.expect:
        return
    key = rand_key(random.randrange(config.keyspace)) if config.keyspace else HOT_KEY
    command = wl.args(key)
    allowed = check_reply(wl, conn.call(*command, raw=True), command)
    if allowed != (wl.expect == "allowed"):
        raise BenchError("%s: after the run, `%s` was no longer %s"
                         % (config, shown(command), wl.expect))


# --------------------------------------------------------------------------------------
# Memory per bucket.


def used_memory(conn):
    # Let the server finish incremental rehashing and free what it freed, then read.
    time.sleep(0.3)
    return int(conn.info("memory")["used_memory"])


# Interleaved repetitions of the memory test; each figure is their median.
MEMORY_ROUNDS = 3
# The memory test's variants, in the order the tables and the chart list them.
MEMORY_ORDER = ("table_10", "table_3", "rl_10", "rl_3", "lua", "floor")
# The budgets for a bucket in a table (docs/tables.md), all in (B): whole ns, with a fraction.
TABLE_BUDGET = {"table_10": 40, "table_3": 48}
MEMORY_METHOD = ("Growth of `used_memory` (INFO memory) in a `FLUSHALL`ed server, divided by"
                 " the buckets added: %s new keys for a key per bucket (the same key names for"
                 " each, every key with an expiry), %s buckets with 16-byte fields over %d keys"
                 " for a table. Includes the key, its value, and its share of the keyspace and"
                 " expiry tables.")


def run_on_own_connection(port, passes, keys, what):
    loader = Conn(port)
    try:
        for make in passes:
            loader.run_all((make(k) for k in keys), what)
    finally:
        loader.close()


def table_bucket(rate_args):
    """RL.HACQUIRE on one of TABLE_KEYS tables, the field "f:" + the key name (16 bytes for
    a rand_key), the table chosen by the key's number."""
    return lambda k: ["RL.HACQUIRE", "tbl:%d" % (int(k[2:]) % TABLE_KEYS), "f:" + k] + list(rate_args)


def memory_per_key(conn, sha, now_ms, n_keys, table_buckets):
    # (label, name, commands per key, buckets, tables: None for a key per bucket)
    variants = [
        ("RL.ACQUIRE 10/s (module, inline)", "rl_10",
         [lambda k: ["RL.ACQUIRE", k] + list(MEM["10"])], n_keys, None),
        ("RL.ACQUIRE 3/s (module, fraction)", "rl_3",
         [lambda k: ["RL.ACQUIRE", k] + list(MEM["3"])], n_keys, None),
        ("RL.HACQUIRE 10/s (table, whole ns)", "table_10",
         [table_bucket(MEM["10"])], table_buckets, TABLE_KEYS),
        ("RL.HACQUIRE 3/s (table, fraction)", "table_3",
         [table_bucket(MEM["3"])], table_buckets, TABLE_KEYS),
        ("Lua script (hash)", "lua",
         [lambda k: ["EVALSHA", sha, "1", k, MEM_RATE, MEM_CAPACITY, str(now_ms), "1"],
          lambda k: ["EVALSHA", sha, "1", k, MEM_RATE, MEM_CAPACITY, str(now_ms + 1), "1"]],
         n_keys, None),
        ("SET PX, 19-digit int (floor)", "floor",
         [lambda k: ["SET", k, FLOOR_VALUE, "PX", "60000"]], n_keys, None),
    ]
    results = {}
    samples = {}
    for label, name, passes, n_buckets, tables in variants * MEMORY_ROUNDS:
        keys = [rand_key(i) for i in range(n_buckets)]
        conn.call("FLUSHALL")
        # Create some buckets of the same kind before the baseline, and keep them: one-off
        # costs (this connection's buffers, the first allocation of each table) then land
        # before it, and the growth counts only what each further bucket costs.
        warm = ["w:%d" % i for i in range(min(1000, n_buckets))]
        # Each batch goes through a connection of its own, closed before used_memory is read:
        # its query and reply buffers (larger for some commands than for others, and resized
        # by the server on its own schedule) then count in neither reading.
        run_on_own_connection(conn.port, passes, warm, "memory warm-up (%s)" % label)
        before = used_memory(conn)
        run_on_own_connection(conn.port, passes, keys, "memory test (%s)" % label)
        after = used_memory(conn)
        want_keys = min(tables, len(warm)) if tables else n_buckets + len(warm)
        if conn.call("DBSIZE") != want_keys:
            raise BenchError("memory test (%s): expected %d keys, found %d"
                             % (label, want_keys, conn.call("DBSIZE")))
        sample = keys[len(keys) // 2]
        if tables:
            sample = table_bucket(())(sample)[1]
            held = sum(conn.call("RL.HLEN", "tbl:%d" % t) for t in range(tables))
            if held != n_buckets + len(warm):
                raise BenchError("memory test (%s): expected %d buckets, found %d"
                                 % (label, n_buckets + len(warm), held))
        pttl = conn.call("PTTL", sample)
        if tables:
            # A table carries no key expiry: the module's sweep reclaims its buckets.
            if pttl != -1:
                raise BenchError("memory test (%s): table %s has an expiry (%d ms)" % (label, sample, pttl))
        elif pttl <= 0:
            raise BenchError("memory test (%s): %s has no expiry" % (label, sample))
        note = ""
        if name == "lua":
            tokens = conn.call("HGET", sample, "tokens")
            if tokens is None or float(tokens) == int(float(tokens)):
                raise BenchError("memory test: the Lua bucket's token count is %r, expected "
                                 "a fraction" % tokens)
            note = "hash, %s; tokens = %s" % (conn.call("OBJECT", "ENCODING", sample), tokens)
        elif name.startswith("table"):
            note = "type %s, %d buckets over %d keys, 16-byte fields" % (
                conn.call("TYPE", sample), n_buckets, tables)
        elif name.startswith("rl"):
            note = "type %s" % conn.call("TYPE", sample)
        else:
            note = "string, %s encoding" % conn.call("OBJECT", "ENCODING", sample)
        samples.setdefault(name, []).append((after - before) / n_buckets)
        results[name] = {"label": label, "bytes": statistics.median(samples[name]), "note": note}
        print("  memory  %-30s %7.2f B/bucket  (%s)" % (label, samples[name][-1], note))
    conn.call("FLUSHALL")
    return results


# --------------------------------------------------------------------------------------
# Leases and reservations: what a lease taken and released, a held lease, and a reservation
# settled cost, against RL.ACQUIRE (and RL.REFUND) on the same server.

# Pairs per measured sequence; each pair on a key of its own, none existing before.
BUDGET_PAIRS = 100_000
# Leases in the key whose memory is measured: the marginal bytes of one more.
BUDGET_LEASES = 1000


def budget_usec(conn, pairs, what):
    """Server µs per call of each command in `pairs` (lists of commands sent in order, a pair
    per fresh key), from INFO commandstats after CONFIG RESETSTAT: {stat name: µs/call}."""
    conn.call("FLUSHALL")
    conn.call("CONFIG", "RESETSTAT")
    conn.run_all((command for pair in pairs for command in pair), what)
    stats = conn.info("commandstats")
    names = {pair_cmd[0].lower() for pair in pairs[:1] for pair_cmd in pair}
    out = {}
    for name in names:
        entry = next((v for k, v in stats.items() if k.lower() == "cmdstat_" + name), None)
        if entry is None:
            raise BenchError("%s: no cmdstat_%s after the run" % (what, name))
        out[name] = parse_stat(entry)["usec_per_call"]
    conn.call("FLUSHALL")
    return out


def lease_budgets(conn, n=BUDGET_PAIRS):
    """The three budgets' figures, each the median of 3 interleaved rounds:
    - `acquire`: RL.ACQUIRE allowed 10/s on a new key (µs/call);
    - `lease_pair`: RL.LEASE of a new key then RL.RELEASE of that lease (µs per pair);
    - `resv_pair`: RL.RESERVE of a new key then RL.SETTLE with half the estimate, which gives
      the other half back (µs per pair);
    - `acq_refund`: RL.ACQUIRE of a new key then RL.REFUND of half the cost (µs per pair);
    - `lease_bytes`: MEMORY USAGE growth per lease from 1 to BUDGET_LEASES leases in a key."""
    rounds = {"acquire": [], "lease_pair": [], "resv_pair": [], "acq_refund": []}
    for rnd in range(3):
        got = budget_usec(conn, [[("RL.ACQUIRE", "a:%d" % i, "10", "1e10", "1000")]
                                 for i in range(n)], "budget acquire")
        rounds["acquire"].append(got["rl.acquire"])
        got = budget_usec(conn, [[("RL.LEASE", "l:%d" % i, "10", "60000", "ID", "w"),
                                  ("RL.RELEASE", "l:%d" % i, "w")] for i in range(n)],
                          "budget lease")
        rounds["lease_pair"].append(got["rl.lease"] + got["rl.release"])
        got = budget_usec(conn, [[("RL.RESERVE", "r:%d" % i, "10", "1e10", "1000", "60000", "ID", "w"),
                                  ("RL.SETTLE", "r:%d" % i, "10", "1e10", "w", "500")]
                                 for i in range(n)], "budget reserve")
        rounds["resv_pair"].append(got["rl.reserve"] + got["rl.settle"])
        got = budget_usec(conn, [[("RL.ACQUIRE", "a:%d" % i, "10", "1e10", "1000"),
                                  ("RL.REFUND", "a:%d" % i, "10", "1e10", "500")]
                                 for i in range(n)], "budget refund")
        rounds["acq_refund"].append(got["rl.acquire"] + got["rl.refund"])
        print("  budgets round %d/3: acquire %.3f µs, lease+release %.3f µs, reserve+settle "
              "%.3f µs, acquire+refund %.3f µs" % tuple([rnd + 1] + [rounds[k][-1] for k in
                                                        ("acquire", "lease_pair", "resv_pair",
                                                         "acq_refund")]), flush=True)
    out = {k: statistics.median(v) for k, v in rounds.items()}
    conn.call("FLUSHALL")
    conn.call("RL.LEASE", "held", str(BUDGET_LEASES), "3600000")
    one = int(conn.call("MEMORY", "USAGE", "held"))
    conn.run_all((("RL.LEASE", "held", str(BUDGET_LEASES), "3600000")
                  for _ in range(BUDGET_LEASES - 1)), "budget held leases")
    many = int(conn.call("MEMORY", "USAGE", "held"))
    out["lease_bytes"] = (many - one) / (BUDGET_LEASES - 1)
    conn.call("FLUSHALL")
    return out


def budget_rows(budgets):
    """The budgets' rows of the targets table."""
    if not budgets:
        return []
    rows = []
    value = budgets["lease_pair"] / budgets["acquire"]
    rows.append(["9", "RL.LEASE + RL.RELEASE ÷ RL.ACQUIRE allowed 10/s: server µs, new keys",
                 "%.2f" % value, "≤ 2", "met" if value <= 2 else "**not met**"])
    got = budgets["lease_bytes"]
    rows.append(["9", "memory per held lease beyond the key (MEMORY USAGE, 1 to %d leases)"
                 % BUDGET_LEASES, "%.2f B" % got, "≤ 32 B", "met" if got <= 32 else "**not met**"])
    value = budgets["resv_pair"] / budgets["acq_refund"]
    rows.append(["9", "RL.RESERVE + RL.SETTLE (half back) ÷ RL.ACQUIRE + RL.REFUND: server µs,"
                 " new keys", "%.2f" % value, "≤ 1", "met" if value <= 1 else "**not met**"])
    return rows


# --------------------------------------------------------------------------------------
# Report.


def fmt_int(x):
    return "{:,}".format(int(round(x)))


def ratio_cells(num, den, target, op):
    """[value, target, status] for a ratio that must be `op` target."""
    if not num or not den:
        return ["n/a", "%s %g" % (op, target), "n/a"]
    value = num / den
    met = value <= target if op == "≤" else value >= target
    return ["%.2f" % value, "%s %g" % (op, target), "met" if met else "**not met**"]


def targets_table(med, memory, budgets=None):
    def get(wl, keys, p, field):
        entry = med.get((wl, keys, p))
        return entry[field] if entry else None

    rows = [["#", "ratio", "value", "target", "status"]]

    def add(number, label, num, den, target, op):
        rows.append([number, label] + ratio_cells(num, den, target, op))

    for rate in ALLOW:
        for p in PIPELINES:
            add("1", "RL.ACQUIRE allowed %s/s ÷ SET PX: server µs/call, random keys, -P %d" % (rate, p),
                get("rl_allowed_" + rate, "random", p, "usec"), get("set_px", "random", p, "usec"),
                1.1, "≤")
    for rate in ALLOW:
        for p in PIPELINES:
            add("1", "Lua allowed ÷ RL.ACQUIRE allowed %s/s: server µs/call, random keys, -P %d" % (rate, p),
                get("lua_allowed", "random", p, "usec"), get("rl_allowed_" + rate, "random", p, "usec"),
                5, "≥")
    for rate in ALLOW:
        add("2", "RL.ACQUIRE allowed %s/s ÷ Lua allowed: req/s, random keys, -P 16" % rate,
            get("rl_allowed_" + rate, "random", 16, "rps"), get("lua_allowed", "random", 16, "rps"),
            4, "≥")
        add("2", "RL.ACQUIRE allowed %s/s ÷ SET PX: req/s, random keys, -P 16" % rate,
            get("rl_allowed_" + rate, "random", 16, "rps"), get("set_px", "random", 16, "rps"),
            0.9, "≥")
    for rate in ALLOW:
        # The classic script sent as the fallback is, from the same Python driver.
        classic = "lua_py_allowed_" + rate
        for name, what in (("script", "rl.lua EVALSHA"), ("function", "rl_acquire_packed FCALL")):
            for p in PIPELINES:
                add("8", "%s ÷ classic Lua script, allowed %s/s: server µs/call, random keys, -P %d"
                    % (what, rate, p), get("%s_allowed_%s" % (name, rate), "random", p, "usec"),
                    get(classic, "random", p, "usec"), 1, "≤")
    for rate in DENY:
        for p in PIPELINES:
            add("3", "RL.ACQUIRE denied %s/s ÷ HMGET: server µs/call, hot key, -P %d" % (rate, p),
                get("rl_denied_" + rate, "hot", p, "usec"), get("hmget", "hot", p, "usec"), 2, "≤")
    for rate in ALLOW:
        for p in PIPELINES:
            add("5", "RL.HACQUIRE allowed %s/s ÷ SET PX: server µs/call, random fields, -P %d" % (rate, p),
                get("table_allowed_" + rate, "random", p, "usec"), get("set_px", "random", p, "usec"),
                1.1, "≤")
    for rate in ALLOW:
        for p in PIPELINES:
            add("6", "RL.HACQUIRE denied %s/s ÷ HMGET: server µs/call, hot field, -P %d" % (rate, p),
                get("table_denied_" + rate, "hot", p, "usec"), get("hmget", "hot", p, "usec"), 2, "≤")
    if memory:
        for name, bound, what in (("table_10", 40, "whole ns"), ("table_3", 48, "with a fraction")):
            if name in memory:
                got = memory[name]["bytes"]
                rows.append(["7", "memory per bucket in a table, %s (all in)" % what,
                             "%.2f B" % got, "≤ %d B" % bound, "met" if got <= bound else "**not met**"])
        for name, bound, what in (("rl_10", 16, "10/s, inline"), ("rl_3", 32, "3/s, with a fraction")):
            diff = memory[name]["bytes"] - memory["floor"]["bytes"]
            rows.append(["4", "memory per bucket %s: RL.ACQUIRE − SET PX floor" % what,
                         "%.2f B" % diff, "≤ %d B" % bound, "met" if diff <= bound else "**not met**"])
    rows += budget_rows(budgets)
    lines = ["| " + " | ".join(rows[0]) + " |", "| --- | --- | ---: | --- | --- |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def previous_profile(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return PROFILE_PLACEHOLDER
    index = text.find(PROFILE_MARKER + "\n")
    if index < 0:
        return PROFILE_PLACEHOLDER
    return text[index + len(PROFILE_MARKER) + 1:] or PROFILE_PLACEHOLDER


def page_head(title, generator, meta):
    """A results page's first lines: its title, when and by what it was written, and the
    command that writes it again."""
    return ["# " + title, "", "Generated by `%s` on %s. Reproduce with:" % (generator, meta["date"]),
            "", "```sh", meta["reproduce"], "```", ""]


def write_results(path, meta, opts, wls, med, memory, n_for, sha, rl_sha, budgets=None):
    lines = page_head("redis-rl benchmark results", "bench/bench.py", meta)
    w = lines.append
    w("| | |")
    w("| --- | --- |")
    w("| server | Redis %s (`%s`), module `target/release/libredis_rl.so`, `--save \"\" --appendonly no` |"
      % (meta["version"], meta["server_binary"]))
    w("| client | redis-benchmark %s, `-c %d`, `-n %s` at `-P 1` and `-n %s` at `-P 16`, `--csv` |"
      % (meta["bench_version"], CLIENTS, fmt_int(n_for[1]), fmt_int(n_for[16])))
    w("| CPU | %s, %d CPUs |" % (meta["cpu"], meta["ncpu"]))
    w("| pinning | redis-server on CPU %d (`taskset -c %d`), redis-benchmark on CPU %d (`taskset -c %d`) |"
      % (opts.server_cpu, opts.server_cpu, opts.client_cpu, opts.client_cpu))
    w("| keys | hot: one key `%s`; random: `-r %s`, keys `%s` (12-digit, zero-padded) |"
      % (HOT_KEY, fmt_int(opts.keyspace), RAND_KEY))
    w("| rounds | %d, interleaved (every configuration once per round); each figure is the median over rounds |"
      % opts.rounds)
    w("| wall time | %s |" % meta["elapsed"])
    w("")
    w("Notes:")
    w("")
    w("- The Lua script cannot read the server's clock, and redis-benchmark cannot send a"
      " clock, so every `EVALSHA` carries the same constant `now_ms` (%d). The script never"
      " refills during a run; its per-call work is otherwise what production sees."
      " `RL.ACQUIRE` reads the server's clock on every call." % meta["now_ms"])
    w("- Each `RL.ACQUIRE` figure is taken at 10/s, whose token interval is a whole number of"
      " ns (the state stays inline in the value pointer), and at 3/s, whose is not (the exact"
      " state carries a fraction of a ns in a 16-byte allocation). The denied path is also"
      " taken at 0.000001/s, the slowest rate, a decimal whose token interval (1e15 ns) is"
      " whole. The script runs at 10/s.")
    w("- Allowed path: (rate, capacity, cost) = %s, so every call is allowed and a bucket, once"
      " created, outlives the run: each take is 100 s of refill (random keys mix first-time"
      " creates with updates, as `SET` does). Denied path: %s; every bucket is emptied once"
      " before the run (the hot key, or all %s random keys by a pipelined prefill), and a"
      " sample of the benchmarked command is checked to be denied. A denied `RL.ACQUIRE`"
      " writes nothing; the script writes (`HSET` + `PEXPIRE`) even on a denial."
      % (", ".join("(%s)" % ", ".join(v) for v in ALLOW.values()),
         ", ".join("(%s)" % ", ".join(v) for v in DENY.values()), fmt_int(opts.keyspace)))
    w("- Before each run: `FLUSHALL`, `CONFIG RESETSTAT`, any prefill, `CONFIG RESETSTAT`, so"
      " `INFO commandstats` counts only the measured calls. Every command was sent once by"
      " hand before benchmarking and did not answer an error, and every run ended with zero"
      " `failed_calls`, `rejected_calls` and `INFO errorstats` (redis-benchmark counts error"
      " replies as successes).")
    w("- redis-rl's fallback, for servers without the module, runs the same allowed path on"
      " random keys: `rl.lua EVALSHA` is clients/lua/rl.lua (the script every client library"
      " ships), `rl_acquire_packed FCALL` the Functions library made from it"
      " (clients/lua/rl_functions.lua), each with the 10 numbers a client computes for (rate,"
      " capacity, cost), packed in one argument of doubles as the libraries send them (to the"
      " script without the mode: its short form for a one-key acquire), and answered packed"
      " (32 bytes) as the libraries read them. redis-benchmark cannot send those bytes"
      " (NUL included), so these rows are driven from Python on the client CPU with the same"
      " clients, pipelines and random keys: their server µs/call is comparable with the other"
      " rows, their req/s and latencies are Python's, not redis-benchmark's. Unlike the classic"
      " script they read the server's clock (`TIME`), are exact, and write nothing on a denial."
      " The classic script is also run at 3/s for them (`Lua script allowed 3/s`), and at"
      " both rates from the same Python driver (`… (Python driver)`): the fallback's"
      " targets (row 8) compare it with those, on the same load from the same client.")
    w("- server µs/call is `usec / calls` of the command in `INFO commandstats` (for a script,"
      " `cmdstat_evalsha` or `cmdstat_fcall`, which include the commands it runs). req/s"
      " and latencies are redis-benchmark's; at `-P 16` a latency covers the whole pipeline.")
    w("- The machine is shared, so absolute numbers are noisy; the ratios are the point.")
    w("")
    w("## Targets")
    w("")
    w(targets_table(med, memory, budgets))
    w("")
    w("## Throughput, latency and server time")
    w("")
    w("Each figure is the median of %d rounds; `-n` is the same for every workload at a given"
      " `-P`, so every workload sees the same key-access pattern." % opts.rounds
      if opts.rounds > 1 else "One round (no median).")
    w("")
    w("| workload | keys | -P | req/s | p50 ms | p99 ms | server µs/call |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for wl in wls:
        for keys in ("random", "hot"):
            for p in PIPELINES:
                m = med.get((wl.name, keys, p))
                if m:
                    w("| %s | %s | %d | %s | %.3f | %.3f | %.2f |"
                      % (wl.label, keys, p, fmt_int(m["rps"]), m["p50"], m["p99"], m["usec"]))
    w("")
    w("Commands as benchmarked (`%s` is replaced by redis-benchmark; `<sha>` is the classic"
      " script's SHA1, %s; `<rl.lua sha>` is clients/lua/rl.lua's, %s):"
      % ("__rand_int__", sha, rl_sha))
    w("")
    w("| workload | command | prefill |")
    w("| --- | --- | --- |")
    for wl in wls:
        command = shown(wl.args(RAND_KEY)).replace(sha, "<sha>").replace(rl_sha, "<rl.lua sha>")
        prefill = ("`%s`" % " ".join(wl.prefill(HOT_KEY)).replace(sha, "<sha>").replace(HOT_KEY, "key")
                   if wl.prefill else "none")
        w("| %s | `%s` | %s |" % (wl.label, command, prefill))
    w("")
    if memory:
        w("## Memory per bucket")
        w("")
        w(MEMORY_METHOD % (fmt_int(meta["memory_keys"]), fmt_int(meta["table_buckets"]),
                           TABLE_KEYS))
        w("")
        w("| bucket | bytes per bucket | note |")
        w("| --- | ---: | --- |")
        for name in MEMORY_ORDER:
            m = memory[name]
            w("| %s | %.1f | %s |" % (m["label"], m["bytes"], m["note"]))
        w("")
        w("Each module bucket is created by one `RL.ACQUIRE k <rate> <capacity> <cost>` with %s; the"
          " Lua bucket by two `EVALSHA` calls at %s/s, capacity %s, 1 ms apart, so its `tokens`"
          " field holds a fraction as in real use."
          % (" and ".join("(%s, %s, %s)" % v for v in MEM.values()), MEM_RATE, MEM_CAPACITY))
        w("")
        w("The same figures on Redis and Valkey side by side, with a chart: [memory.md](memory.md)"
          " (`make bench-memory`).")
        w("")
    w("## Chart")
    w("")
    w("![server µs per call and req/s at -P 16](chart.svg)")
    w("")
    w("## Profile")
    w("")
    w(PROFILE_MARKER)
    text = "\n".join(lines) + "\n" + previous_profile(path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# --------------------------------------------------------------------------------------
# Chart: grouped horizontal bars, plain SVG.


def nice_ticks(maximum, count=5):
    if maximum <= 0:
        return [0, 1]
    raw = maximum / count
    magnitude = 10 ** int(f"{raw:e}".split("e")[1])
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks, value = [], 0.0
    while value < maximum + step * 0.999:
        ticks.append(value)
        value += step
    return ticks


def fmt_value(value, kind):
    if kind == "rps":
        if value >= 1e6:
            return "%.2fM" % (value / 1e6)
        return "%.0fk" % (value / 1000) if value >= 10000 else "%.0f" % value
    return "%.2f" % value


def chart_svg(wls, med, meta):
    series = [("random", "%s random keys" % fmt_int(meta["keyspace"]), "#3b6fb6"),
              ("hot", "one hot key", "#e0873a")]
    panels = [("usec", 16, "server µs per call at -P 16 (INFO commandstats), lower is better"),
              ("rps", 16, "requests per second at -P 16 (redis-benchmark), higher is better")]
    groups = [wl for wl in wls if any(med.get((wl.name, k, 16)) for k, _, _ in series)]
    left, right, bar_h, bar_gap, group_gap = 190, 90, 15, 2, 14
    width = 1000
    plot_w = width - left - right
    group_h = len(series) * (bar_h + bar_gap) + group_gap
    panel_h = len(groups) * group_h + 50
    top = 84
    height = top + len(panels) * (panel_h + 10)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d"'
           ' font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">'
           % (width, height, width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="28" font-size="18" font-weight="bold">RL.ACQUIRE vs the Lua token'
           ' bucket vs plain commands</text>' % 16,
           '<text x="16" y="50" fill="#555">%s</text>' % escape(
               "Redis %s, %s; server on CPU %d, redis-benchmark on CPU %d, -c %d; median of %d"
               " rounds; %s" % (meta["version"], meta["cpu"], meta["server_cpu"],
                                meta["client_cpu"], CLIENTS, meta["rounds"], meta["date"]))]
    legend_x = 16
    for _, name, color in series:
        out.append('<rect x="%d" y="60" width="14" height="14" fill="%s"/>' % (legend_x, color))
        out.append('<text x="%d" y="72">%s</text>' % (legend_x + 20, escape(name)))
        legend_x += 40 + 8 * len(name)
    y0 = top
    for field, pipeline, axis_label in panels:
        values = [med[(wl.name, k, pipeline)][field] for wl in groups for k, _, _ in series
                  if med.get((wl.name, k, pipeline))]
        ticks = nice_ticks(max(values) if values else 1)
        scale = plot_w / ticks[-1]
        plot_top = y0 + 10
        plot_bottom = plot_top + len(groups) * group_h
        for tick in ticks:
            x = left + tick * scale
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                       % (x, plot_top, x, plot_bottom))
            out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>'
                       % (x, plot_bottom + 16, escape(fmt_value(tick, field) if field == "rps"
                                                       else "%g" % tick)))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>'
                   % (left + plot_w / 2, plot_bottom + 36, escape(axis_label)))
        for gi, wl in enumerate(groups):
            gy = plot_top + gi * group_h
            label_y = gy + (len(series) * (bar_h + bar_gap)) / 2 + 4
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                       % (left - 8, label_y, escape(wl.label)))
            for si, (keys, _, color) in enumerate(series):
                m = med.get((wl.name, keys, pipeline))
                if not m:
                    continue
                by = gy + si * (bar_h + bar_gap)
                bw = max(1.0, m[field] * scale)
                out.append('<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"/>'
                           % (left, by, bw, bar_h, color))
                out.append('<text x="%.1f" y="%.1f" font-size="12">%s</text>'
                           % (left + bw + 4, by + bar_h - 3, escape(fmt_value(m[field], field))))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>'
                   % (left, plot_top, left, plot_bottom))
        y0 = plot_bottom + 50
    out.append("</svg>")
    return "\n".join(out) + "\n"


def memory_svg(runs, meta):
    """Bytes per bucket, one group per kind of bucket, one bar per server; the table's
    budgets as marks. `runs` is [(server label, memory results)]."""
    colors = ("#3b6fb6", "#e0873a", "#4d9a5b", "#8e5ab5")
    left, right, bar_h, bar_gap, group_gap = 300, 90, 15, 2, 14
    width = 1000
    plot_w = width - left - right
    groups = [name for name in MEMORY_ORDER if any(name in m for _, m in runs)]
    group_h = len(runs) * (bar_h + bar_gap) + group_gap
    top = 84
    plot_top = top + 10
    plot_bottom = plot_top + len(groups) * group_h
    height = plot_bottom + 60
    values = [m[name]["bytes"] for _, m in runs for name in groups if name in m]
    ticks = nice_ticks(max(values) if values else 1)
    scale = plot_w / ticks[-1]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d"'
           ' font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">'
           % (width, height, width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="16" y="28" font-size="18" font-weight="bold">Memory per bucket: a table,'
           ' a key per bucket, the Lua script, the SET PX floor</text>',
           '<text x="16" y="50" fill="#555">%s</text>' % escape(
               "growth of used_memory / buckets: %s keys, or %s buckets over %d tables with"
               " 16-byte fields; median of %d; %s" % (
                   fmt_int(meta["memory_keys"]), fmt_int(meta["table_buckets"]), TABLE_KEYS,
                   MEMORY_ROUNDS, meta["date"]))]
    legend_x = 16
    for (label, _), color in zip(runs, colors):
        out.append('<rect x="%d" y="60" width="14" height="14" fill="%s"/>' % (legend_x, color))
        out.append('<text x="%d" y="72">%s</text>' % (legend_x + 20, escape(label)))
        legend_x += 40 + 8 * len(label)
    for tick in ticks:
        x = left + tick * scale
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>'
                   % (x, plot_top, x, plot_bottom))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%g</text>'
                   % (x, plot_bottom + 16, tick))
    out.append('<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>'
               % (left + plot_w / 2, plot_bottom + 36,
                  escape("bytes per bucket, all in (lower is better); dashed: the table's budget")))
    for gi, name in enumerate(groups):
        gy = plot_top + gi * group_h
        label = next(m[name]["label"] for _, m in runs if name in m)
        out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                   % (left - 8, gy + (len(runs) * (bar_h + bar_gap)) / 2 + 4, escape(label)))
        for si, ((_, memory), color) in enumerate(zip(runs, colors)):
            if name not in memory:
                continue
            by = gy + si * (bar_h + bar_gap)
            bw = max(1.0, memory[name]["bytes"] * scale)
            out.append('<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="%s"/>'
                       % (left, by, bw, bar_h, color))
            out.append('<text x="%.1f" y="%.1f" font-size="12">%.1f</text>'
                       % (left + bw + 4, by + bar_h - 3, memory[name]["bytes"]))
        if name in TABLE_BUDGET:
            x = left + TABLE_BUDGET[name] * scale
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b"'
                       ' stroke-dasharray="4 3"/>'
                       % (x, gy - 2, x, gy + len(runs) * (bar_h + bar_gap)))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>'
               % (left, plot_top, left, plot_bottom))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_memory(out_dir, runs, meta):
    """memory.md (a column per server) and memory.svg."""
    lines = page_head("redis-rl memory per bucket", "bench/bench.py --memory-only", meta)
    w = lines.append
    w(MEMORY_METHOD % (fmt_int(meta["memory_keys"]), fmt_int(meta["table_buckets"]), TABLE_KEYS)
      + " Each figure is the median of %d interleaved rounds." % MEMORY_ROUNDS)
    w("")
    w("| bucket | %s | budget |" % " | ".join(label for label, _ in runs))
    w("| --- | %s | ---: |" % " | ".join("---:" for _ in runs))
    for name in MEMORY_ORDER:
        cells = ["%.1f" % m[name]["bytes"] if name in m else "—" for _, m in runs]
        label = next(m[name]["label"] for _, m in runs if name in m)
        budget = "≤ %d" % TABLE_BUDGET[name] if name in TABLE_BUDGET else ""
        w("| %s | %s | %s |" % (label, " | ".join(cells), budget))
    w("")
    w("Each module bucket is created by one `RL.ACQUIRE k <rate> <capacity> <cost>` (or"
      " `RL.HACQUIRE`) with %s; the Lua bucket by two `EVALSHA` calls at %s/s, capacity %s,"
      " 1 ms apart, so its `tokens` field holds a fraction as in real use."
      % (" and ".join("(%s, %s, %s)" % v for v in MEM.values()), MEM_RATE, MEM_CAPACITY))
    w("")
    w("![bytes per bucket on each server](memory.svg)")
    path = os.path.join(out_dir, "memory.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "memory.svg"), "w", encoding="utf-8") as f:
        f.write(memory_svg(runs, meta))
    return path


def memory_only(opts, argv):
    """The memory test alone, on each server given: writes memory.md and memory.svg."""
    started = time.monotonic()
    out_dir = opts.out or (tempfile.mkdtemp(prefix="redis-rl-bench-smoke-") if opts.smoke
                           else BENCH_DIR)
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    for binary in [opts.redis_server] + opts.also_server:
        with running_server(binary, opts.module, opts.server_cpu) as server:
            conn = server.start()
            info = conn.info("server")
            name = info.get("server_name", "redis").capitalize()
            version = info.get("%s_version" % name.lower()) or info.get("redis_version", "?")
            allocator = conn.info("memory").get("mem_allocator", "?")
            label = "%s %s (%s)" % (name, version, allocator)
            print("memory test on %s (%s), port %d" % (label, binary, server.port))
            with open(LUA_SCRIPT, encoding="utf-8") as f:
                sha = conn.call("SCRIPT", "LOAD", f.read())
            memory = memory_per_key(conn, sha, int(time.time() * 1000), opts.memory_keys,
                                    opts.table_buckets)
            conn.close()
            runs.append((label, memory))
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "memory_keys": opts.memory_keys,
        "table_buckets": opts.table_buckets,
        "reproduce": "make bench-memory" if not opts.smoke else "python3 bench/bench.py "
                     + " ".join(argv),
    }
    path = write_memory(out_dir, runs, meta)
    print("wrote %s and memory.svg in %.0f s" % (path, time.monotonic() - started))
    return 0


# --------------------------------------------------------------------------------------


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def tool_version(binary):
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        match = re.search(r"(\d+\.\d+\.\d+)", out)
        return match.group(1) if match else out.strip()
    except OSError:
        return "unknown"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="1 round, tiny runs, 1,000 keys, output in a temp dir; checks every "
                        "command still works, asserts no timing")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--requests-scale", type=float, default=1.0,
                   help="multiply -n (200,000 at -P 1, 1,000,000 at -P 16) by this")
    p.add_argument("--keyspace", type=int, default=100_000,
                   help="random keys per run, redis-benchmark -r (default 100,000)")
    p.add_argument("--memory-keys", type=int, default=100_000,
                   help="keys created by the memory test (default 100,000)")
    p.add_argument("--table-buckets", type=int, default=1_000_000,
                   help="buckets in the table RL.HACQUIRE runs against, and in the table memory "
                        "test (over %d keys) (default 1,000,000)" % TABLE_KEYS)
    p.add_argument("--only", default="",
                   help="comma-separated workload names to run (%s, memory for the memory test, or budgets for the lease and reservation budgets); "
                        "default all" % ", ".join(w.name for w in workloads("sha", 0)))
    p.add_argument("--out", default=None,
                   help="output directory for results.md and chart.svg (default bench/)")
    p.add_argument("--memory-only", action="store_true",
                   help="run only the memory test, on --redis-server and each --also-server, and "
                        "write memory.md and memory.svg")
    p.add_argument("--also-server", action="append", default=[],
                   help="with --memory-only: another server binary to measure (repeatable)")
    p.add_argument("--module", default=DEFAULT_MODULE, help="the module to load")
    p.add_argument("--redis-server", default=os.environ.get("REDIS_SERVER", "redis-server"),
                   help="server binary (default $REDIS_SERVER or redis-server)")
    p.add_argument("--redis-benchmark", default="redis-benchmark")
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    opts = p.parse_args(argv)
    if opts.smoke:
        opts.rounds = 1
        opts.keyspace = min(opts.keyspace, 1000)
        opts.memory_keys = min(opts.memory_keys, 1000)
        opts.table_buckets = min(opts.table_buckets, 1000)
    if (opts.rounds < 1 or opts.keyspace < 1 or opts.memory_keys < 1 or opts.table_buckets < 1
            or opts.requests_scale <= 0):
        p.error("--rounds, --keyspace, --memory-keys and --requests-scale must be positive")
    return opts


def check_environment(opts):
    if shutil.which("taskset") is None:
        raise BenchError("taskset not found: it pins the server and the client to separate CPUs."
                         " It is part of util-linux (Debian/Ubuntu: apt-get install util-linux).")
    for binary in (opts.redis_server, opts.redis_benchmark):
        if shutil.which(binary) is None:
            raise BenchError("%s not found (run `make deps`, or install redis-server and "
                             "redis-tools)" % binary)
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = set(range(os.cpu_count() or 1))
    for cpu in (opts.server_cpu, opts.client_cpu):
        if cpu not in cpus:
            raise BenchError("CPU %d is not available to this process (have %s); choose others "
                             "with --server-cpu/--client-cpu" % (cpu, sorted(cpus)))
    if not os.path.isfile(opts.module):
        raise BenchError("module %s not found: build it with `cargo build --release --lib`"
                         % opts.module)
    for path in (LUA_SCRIPT, RL_SCRIPT, RL_FUNCTIONS):
        if not os.path.isfile(path):
            raise BenchError("the Lua script %s is missing" % path)


def main(argv):
    opts = parse_args(argv)
    check_environment(opts)
    if opts.memory_only:
        return memory_only(opts, argv)
    started = time.monotonic()
    if opts.smoke:
        out_dir = opts.out or tempfile.mkdtemp(prefix="redis-rl-bench-smoke-")
    else:
        out_dir = opts.out or BENCH_DIR
    os.makedirs(out_dir, exist_ok=True)
    scale = opts.requests_scale
    n_for = {p: max(1, int(BASE_REQUESTS[p] * scale)) for p in PIPELINES}
    if opts.smoke:
        n_for = {p: max(1, int(2000 * scale)) for p in PIPELINES}
    now_ms = int(time.time() * 1000)

    with running_server(opts.redis_server, opts.module, opts.server_cpu) as server:
        conn = server.start()
        print("redis-server on 127.0.0.1:%d (CPU %d), redis-benchmark on CPU %d, work dir %s"
              % (server.port, opts.server_cpu, opts.client_cpu, server.workdir))
        with open(LUA_SCRIPT, encoding="utf-8") as f:
            sha = conn.call("SCRIPT", "LOAD", f.read())
        rl_sha = load_fallback(conn)
        wls = workloads(sha, now_ms, rl_sha)
        if opts.only:
            wanted = set(opts.only.split(","))
            unknown = wanted - {w.name for w in wls} - {"memory", "budgets"}
            if unknown:
                raise BenchError("unknown workload(s) in --only: %s" % ", ".join(sorted(unknown)))
            wls = [w for w in wls if w.name in wanted]
        # A table's random fields range over the whole loaded table.
        configs = [Config(wl, ks, p) for wl in wls
                   for ks in ((opts.table_buckets if wl.preload else opts.keyspace), 0)
                   if ks or wl.hot
                   for p in PIPELINES]

        # Preflight: each exact command, once by hand, on a fresh server. An error reply here
        # would be counted as a success by redis-benchmark.
        for wl in wls:
            for key in (HOT_KEY, rand_key(0)):
                conn.call("FLUSHALL")
                command = wl.args(key)
                if wl.prefill:
                    conn.call(*wl.prefill(key))
                conn.sock.sendall(encode(command))
                check_reply(wl, conn.read(raw=True), command)
        print("preflight: every benchmarked command answers without an error")

        memory = None
        if not opts.only or "memory" in opts.only.split(","):
            memory = memory_per_key(conn, sha, now_ms, opts.memory_keys, opts.table_buckets)

        budgets = None
        if not opts.only or "budgets" in opts.only.split(","):
            budgets = lease_budgets(conn, 1000 if opts.smoke else BUDGET_PAIRS)

        runs = {}
        for rnd in range(1, opts.rounds + 1):
            for config in configs:
                n = n_for[config.pipeline]
                prepare(conn, config, sample_size=1000, table_buckets=opts.table_buckets)
                command = config.workload.args(RAND_KEY if config.keyspace else HOT_KEY)
                # The fallback's packed numbers are bytes, which redis-benchmark cannot send.
                python = config.workload.python or any(isinstance(a, bytes) for a in command)
                drive = run_python_benchmark if python else run_benchmark
                result = drive(opts, server.port, n, config.pipeline, command, config.keyspace)
                result["usec"] = collect_stats(conn, config, n)
                post_check(conn, config)
                key = (config.workload.name, config.keys_label, config.pipeline)
                runs.setdefault(key, []).append(result)
                print("[round %d/%d] %s %10s req/s  p50 %6.3f ms  p99 %6.3f ms  %6.2f µs/call  (%.1f s)"
                      % (rnd, opts.rounds, config, fmt_int(result["rps"]), result["p50"],
                         result["p99"], result["usec"], result["wall"]), flush=True)

        version = conn.info("server").get("redis_version", "unknown")
        conn.close()
        med = {key: {f: statistics.median(r[f] for r in rs) for f in ("rps", "p50", "p99", "usec")}
               for key, rs in runs.items()}
        elapsed = time.monotonic() - started
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "version": version,
            "server_binary": opts.redis_server,
            "bench_version": tool_version(opts.redis_benchmark),
            "cpu": cpu_model(),
            "ncpu": os.cpu_count() or 0,
            "server_cpu": opts.server_cpu,
            "client_cpu": opts.client_cpu,
            "rounds": opts.rounds,
            "now_ms": now_ms,
            "memory_keys": opts.memory_keys,
            "table_buckets": opts.table_buckets,
            "keyspace": opts.keyspace,
            "elapsed": "%d min %02d s" % divmod(int(elapsed), 60),
            "reproduce": {(): "make bench", ("--smoke",): "make bench-smoke"}.get(
                tuple(argv), "python3 bench/bench.py " + " ".join(argv)),
        }
        results_md = os.path.join(out_dir, "results.md")
        write_results(results_md, meta, opts, wls, med, memory, n_for, sha, rl_sha, budgets)
        with open(os.path.join(out_dir, "chart.svg"), "w", encoding="utf-8") as f:
            f.write(chart_svg(wls, med, meta))
        print()
        print(targets_table(med, memory, budgets))
        print()
        print("wrote %s and %s in %s" % (results_md, os.path.join(out_dir, "chart.svg"),
                                         meta["elapsed"]))
        if opts.smoke:
            print("smoke run: outputs in %s (timings are not checked)" % out_dir)
    return 0


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        sys.exit(main(sys.argv[1:]))
    except (BenchError, OSError) as e:
        print("bench: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        sys.exit(130)
