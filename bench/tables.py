#!/usr/bin/env python3
"""What moving a big table costs (`make bench-tables`): DUMP, RESTORE and DEBUG RELOAD of one
table of N buckets against a native hash of N fields, in the same run, on the same server.

Starts its own redis-server (the release module, no persistence, a free port, a temp dir,
pinned to one CPU). For each value in turn, on a flushed server:

  table  one key filled with RL.HSETSTATE (1,000 random 16-byte tags a call), a third of the
         buckets with a fraction of a ns;
  hash   one key filled with HSET (1,000 fields a call), 16-byte fields, 19-digit values (what
         a bucket's instant is as a string).

then, --rounds times each: DUMP of the key, RESTORE of that payload under another key (then
DEL of it), and DEBUG RELOAD (SAVE and load of the whole RDB, the key alone in it); the copy
and the reloaded key must equal the original (a table's DUMP byte for byte, a hash's HLEN),
or the run fails. Each
figure is the server's time for the command (`usec` of INFO commandstats, reset before each
call), the median of the rounds, divided by N: ns per entry.

Then MIGRATE itself, for each size of --sizes: a second redis-server with the module (the
target, on another CPU) and, for a table of that many buckets and then a hash of as many
fields (filled as above), --rounds times: DEL of the key on the target, then
`MIGRATE 127.0.0.1 <target port> <key> 0 <timeout> COPY REPLACE` on the source. Each round
records the wall time of the call as the client sees it (the source is blocked that long:
it serializes, sends and waits for the target's RESTORE) and the source's own time for it
(`usec` of cmdstat_migrate); a connection MIGRATE caches is opened before the first round.
The table's copy is checked byte for byte (DUMP on both sides), the hash's by HLEN. From the
medians, the largest table whose MIGRATE stays under --budget-ms is interpolated linearly
between the two measured sizes around the budget (and says so). Standard library only.

Usage:
  python3 bench/tables.py                    # N = 1,000,000, MIGRATE at 10k ... 1M
  python3 bench/tables.py --buckets 10000000 --out bench/tables.md
  python3 bench/tables.py --smoke            # seconds: tiny sizes, 1 round, writes nothing
"""

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import DEFAULT_MODULE, BenchError, Conn, running_server  # noqa: E402

DEFAULT_SIZES = "10000,30000,50000,70000,100000,150000,300000,1000000"

BASE_NS = 4_102_444_800_000_000_000  # 2100-01-01: nothing fills during a run
PER_CALL = 1000


class RawConn(Conn):
    """Bulk replies of call_bytes as bytes (a DUMP payload is binary)."""

    def call_bytes(self, *args):
        return self.call(*args, raw=True)


def fill_table(conn, key, n, rng):
    def commands():
        for start in range(0, n, PER_CALL):
            args = ["RL.HSETSTATE", key]
            for i in range(start, min(n, start + PER_CALL)):
                frac = rng.getrandbits(62) if i % 3 == 0 else 0
                args += [rng.randbytes(16), BASE_NS + i, frac]
            yield args
    conn.run_all(commands(), "fill the table")


def fill_hash(conn, key, n, rng):
    def commands():
        for start in range(0, n, PER_CALL):
            args = ["HSET", key]
            for i in range(start, min(n, start + PER_CALL)):
                args += [rng.randbytes(8).hex(), str(BASE_NS + i)]
            yield args
    conn.run_all(commands(), "fill the hash")


def server_usec(conn, stat, *command):
    """The server's time for one command, from INFO commandstats."""
    conn.call("CONFIG", "RESETSTAT")
    conn.call(*command)
    line = conn.info("commandstats").get("cmdstat_" + stat)
    if line is None:
        raise BenchError("no %s in INFO commandstats" % stat)
    fields = dict(part.split("=") for part in line.split(","))
    return int(fields["usec"])


def same_value(conn, key, other, payload, exact):
    """Whether `other` holds what `key` held when its DUMP was `payload`: the same DUMP if
    exact (a table's encoding is in bucket order), else the same HLEN (a big hash's DUMP
    follows its dict's layout, which a RESTORE or a reload may change)."""
    if exact:
        return conn.call_bytes("DUMP", other) == payload
    return conn.call("HLEN", other) == conn.call("HLEN", key)


def measure(conn, key, n, rounds, exact):
    """Medians per entry of DUMP, RESTORE and DEBUG RELOAD of `key`; each round's RESTOREd
    copy and the key after the reload are checked against the round's DUMP (the round trip
    must be equal, not only timed)."""
    dumps, restores, reloads, sizes = [], [], [], []
    for _ in range(rounds):
        dumps.append(server_usec(conn, "dump", "DUMP", key))
        payload = conn.call_bytes("DUMP", key)
        sizes.append(len(payload))
        restores.append(server_usec(conn, "restore", "RESTORE", key + ":copy", 0, payload))
        if not same_value(conn, key, key + ":copy", payload, exact):
            raise BenchError("the RESTOREd copy of %s (%d entries) differs from it" % (key, n))
        conn.call("DEL", key + ":copy")
        reloads.append(server_usec(conn, "debug", "DEBUG", "RELOAD"))
        if exact and conn.call_bytes("DUMP", key) != payload:
            raise BenchError("%s (%d entries) differs after DEBUG RELOAD" % (key, n))
    per = lambda usecs: statistics.median(usecs) * 1000.0 / n  # noqa: E731
    return {"dump": per(dumps), "restore": per(restores), "reload": per(reloads),
            "bytes": statistics.median(sizes) / n}


def migrate_round(src, dst, key, timeout_ms):
    """One MIGRATE of key from src to dst: (wall ms, the source's usec for it)."""
    dst.call("DEL", key)
    src.call("CONFIG", "RESETSTAT")
    start = time.perf_counter()
    reply = src.call("MIGRATE", "127.0.0.1", dst.port, key, 0, timeout_ms, "COPY", "REPLACE")
    wall_ms = (time.perf_counter() - start) * 1000.0
    if reply != "OK":
        raise BenchError("MIGRATE of %s answered %r" % (key, reply))
    line = src.info("commandstats").get("cmdstat_migrate")
    if line is None:
        raise BenchError("no migrate in the source's INFO commandstats")
    fields = dict(part.split("=") for part in line.split(","))
    return wall_ms, int(fields["usec"])


def measure_migrate(src, dst, key, n, rounds, timeout_ms, exact):
    """Medians of MIGRATE's wall ms and server ms for one key of n entries. Checks the copy:
    the same DUMP if exact (a table's encoding is in bucket order), else the same HLEN (a big
    hash's DUMP follows its dict's layout, which differs between the two servers)."""
    walls, usecs = [], []
    for _ in range(rounds):
        wall_ms, usec = migrate_round(src, dst, key, timeout_ms)
        walls.append(wall_ms)
        usecs.append(usec)
    if exact:
        mine, theirs = src.call_bytes("DUMP", key), dst.call_bytes("DUMP", key)
    else:
        mine, theirs = src.call("HLEN", key), dst.call("HLEN", key)
    if mine != theirs:
        raise BenchError("the migrated %s of %d entries differs from the source's" % (key, n))
    dst.call("DEL", key)
    return {"wall_ms": statistics.median(walls), "min_ms": min(walls), "max_ms": max(walls),
            "server_ms": statistics.median(usecs) / 1000.0,
            "ns": statistics.median(walls) * 1e6 / n}


def largest_under(points, budget_ms):
    """From [(size, ms)] sorted by size: (size, how) of the largest size under budget_ms, by
    linear interpolation between the last measured size under it and the first over it."""
    below = [(s, ms) for s, ms in points if ms < budget_ms]
    above = [(s, ms) for s, ms in points if ms >= budget_ms]
    if not below:
        s, ms = points[0]
        return int(s * budget_ms / ms), "scaled down from the smallest size, which is over"
    if not above:
        return points[-1][0], "the largest size measured (all sizes are under it)"
    (s1, t1), (s2, t2) = below[-1], above[0]
    if s2 < s1 or t2 <= t1:
        return s1, "the largest size measured under it (the times are not monotonic)"
    return int(s1 + (budget_ms - t1) * (s2 - s1) / (t2 - t1)), (
        "interpolated linearly between %s and %s" % (format(s1, ","), format(s2, ",")))


def measure_all_migrates(opts, src, rng):
    """MIGRATE of a table and a hash at each size, to a second server: {(name, size): row}."""
    sizes = opts.size_list
    timeout_ms = 600_000
    rows = {}
    with running_server(opts.redis_server, opts.module, opts.target_cpu, opts.server_arg) as target:
        first = target.start()
        first.close()
        dst = RawConn(target.port, timeout=600.0)
        # MIGRATE caches its connection to the target (10 s idle): open it outside the rounds.
        src.call("SET", "warm", "1")
        migrate_round(src, dst, "warm", timeout_ms)
        src.call("DEL", "warm")
        for size in sizes:
            for name, fill in (("table", fill_table), ("hash", fill_hash)):
                src.call("FLUSHALL")
                fill(src, "m", size, rng)
                # A cached connection idle for 10 s is closed: open it again before timing.
                src.call("SET", "warm", "1")
                migrate_round(src, dst, "warm", timeout_ms)
                src.call("DEL", "warm")
                rows[(name, size)] = measure_migrate(src, dst, "m", size, opts.rounds, timeout_ms,
                                                     name == "table")
                print("migrate %s %d: %s" % (name, size, {k: round(v, 1) for k, v in
                                                           rows[(name, size)].items()}), flush=True)
        src.call("FLUSHALL")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buckets", type=int, default=1_000_000, help="N (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--module", default=DEFAULT_MODULE)
    parser.add_argument("--redis-server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra redis-server argument (repeat: --server-arg=--rdbcompression --server-arg=no)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help="table sizes for MIGRATE, comma-separated (default %s)" % DEFAULT_SIZES)
    parser.add_argument("--budget-ms", type=float, default=100.0,
                        help="the MIGRATE time to find the largest table under (default 100)")
    parser.add_argument("--target-cpu", type=int, default=0, help="the MIGRATE target's CPU")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: 2,000 buckets, MIGRATE at 1,000 and 3,000, 1 round, no file")
    parser.add_argument("--out", help="also write the results as Markdown to this file")
    opts = parser.parse_args()
    if opts.smoke:
        opts.buckets, opts.sizes, opts.rounds, opts.out = 2000, "1000,3000", 1, None
    sizes = sorted({int(x) for x in opts.sizes.split(",") if x.strip()})
    if not sizes or sizes[0] <= 0 or opts.buckets <= 0 or opts.rounds <= 0:
        raise BenchError("--buckets, --rounds and every --sizes value must be positive")
    opts.size_list = sizes
    n = opts.buckets
    sizes = opts.size_list
    rng = random.Random(1)
    results = {}
    debug = ["--enable-debug-command", "yes"] + opts.server_arg
    with running_server(opts.redis_server, opts.module, opts.server_cpu, debug) as server:
        conn = server.start()
        conn.close()
        conn = RawConn(server.port, timeout=600.0)
        version = conn.info("server").get("redis_version")
        for name, fill in (("table", fill_table), ("hash", fill_hash)):
            conn.call("FLUSHALL")
            fill(conn, "k", n, rng)
            results[name] = measure(conn, "k", n, opts.rounds, name == "table")
            print("%s: %s" % (name, {k: round(v, 1) for k, v in results[name].items()}),
                  flush=True)
        conn.call("FLUSHALL")
        migrate = measure_all_migrates(opts, conn, rng)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    lines = [
        "# Moving a big table: DUMP, RESTORE, DEBUG RELOAD, MIGRATE",
        "",
        "Written by `make bench-tables` (`bench/tables.py --buckets %d --rounds %d --sizes %s`) "
        "on %s: server "
        "time per entry (INFO commandstats, median of the rounds), one table of %s buckets "
        "against one hash of as many fields, same run; each round's RESTOREd copy and the key "
        "after DEBUG RELOAD checked against its DUMP (the table's byte for byte, the hash's by "
        "HLEN). Redis %s, release build, %s, %s "
        "(%d CPUs, shared, load average %s at the end)."
        % (n, opts.rounds, ",".join(map(str, sizes)), time.strftime("%Y-%m-%d", time.gmtime()),
           format(n, ","), version, platform.machine(), cpu or "unknown CPU",
           os.cpu_count() or 0, " ".join("%.1f" % x for x in os.getloadavg())),
        "",
        "| value | DUMP ns/entry | RESTORE ns/entry | DEBUG RELOAD ns/entry | payload bytes/entry |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in ("table", "hash"):
        r = results[name]
        lines.append("| %s | %.0f | %.0f | %.0f | %.1f |"
                     % (name, r["dump"], r["restore"], r["reload"], r["bytes"]))
    points = [(size, migrate[("table", size)]["wall_ms"]) for size in sizes]
    limit, how = largest_under(points, opts.budget_ms)
    lines += [
        "",
        "## MIGRATE",
        "",
        "`MIGRATE 127.0.0.1 <port> <key> 0 <timeout> COPY REPLACE` from this server to a second "
        "one with the module (on another CPU), median of %d rounds: the wall time of the call "
        "(the source is blocked that long: it serializes, sends and waits for the target's "
        "RESTORE) and the source's own time for it (cmdstat_migrate); the table's copy checked "
        "byte for byte (DUMP on both servers), the hash's by HLEN." % opts.rounds,
        "",
        "| entries | table ms (wall) | table ms (wall, fastest–slowest round) | table ms (source) "
        "| table ns/bucket | hash ms (wall) | hash ms (source) | hash ns/field |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        t, h = migrate[("table", size)], migrate[("hash", size)]
        lines.append("| %s | %.1f | %.1f–%.1f | %.1f | %.0f | %.1f | %.1f | %.0f |"
                     % (format(size, ","), t["wall_ms"], t["min_ms"], t["max_ms"], t["server_ms"], t["ns"],
                        h["wall_ms"], h["server_ms"], h["ns"]))
    lines += [
        "",
        "Largest table whose MIGRATE stays under %g ms (wall): **%s buckets**, %s."
        % (opts.budget_ms, format(limit, ","), how),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print("bench-tables: %s" % e, file=sys.stderr)
        sys.exit(1)
