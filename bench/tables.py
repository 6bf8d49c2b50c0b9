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
DEL of it), and DEBUG RELOAD (SAVE and load of the whole RDB, the key alone in it). Each
figure is the server's time for the command (`usec` of INFO commandstats, reset before each
call), the median of the rounds, divided by N: ns per entry. MIGRATE serializes as DUMP does,
and the target loads as RESTORE does. Standard library only.

Usage:
  python3 bench/tables.py                    # N = 1,000,000
  python3 bench/tables.py --buckets 10000000 --out bench/tables.md
"""

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import DEFAULT_MODULE, BenchError, Conn, running_server  # noqa: E402

BASE_NS = 4_102_444_800_000_000_000  # 2100-01-01: nothing fills during a run
PER_CALL = 1000


class RawConn(Conn):
    """Bulk replies of call_bytes as bytes (a DUMP payload is binary)."""

    raw = False

    def call_bytes(self, *args):
        self.raw = True
        try:
            return self.call(*args)
        finally:
            self.raw = False

    def read(self):
        if not self.raw:
            return super().read()
        line = self.reader.readline()
        if line[:1] == b"$":
            size = int(line[1:-2])
            return None if size < 0 else self.reader.read(size + 2)[:-2]
        if line[:1] == b"*" or not line:
            raise BenchError("unexpected reply: %r" % line)
        # Not a bulk string: let the base class parse the line it would have read.
        return _parse_line(line)


def _parse_line(line):
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise BenchError(rest.decode(errors="replace"))
    raise BenchError("unexpected reply: %r" % line)


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


def measure(conn, key, n, rounds):
    dumps, restores, reloads, sizes = [], [], [], []
    for _ in range(rounds):
        dumps.append(server_usec(conn, "dump", "DUMP", key))
        payload = conn.call_bytes("DUMP", key)
        sizes.append(len(payload))
        restores.append(server_usec(conn, "restore", "RESTORE", key + ":copy", 0, payload))
        conn.call("DEL", key + ":copy")
        reloads.append(server_usec(conn, "debug", "DEBUG", "RELOAD"))
    per = lambda usecs: statistics.median(usecs) * 1000.0 / n  # noqa: E731
    return {"dump": per(dumps), "restore": per(restores), "reload": per(reloads),
            "bytes": statistics.median(sizes) / n}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buckets", type=int, default=1_000_000, help="N (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--module", default=DEFAULT_MODULE)
    parser.add_argument("--redis-server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra redis-server argument (repeat: --server-arg=--rdbcompression --server-arg=no)")
    parser.add_argument("--out", help="also write the results as Markdown to this file")
    opts = parser.parse_args()
    n = opts.buckets
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
            results[name] = measure(conn, "k", n, opts.rounds)
            print("%s: %s" % (name, {k: round(v, 1) for k, v in results[name].items()}),
                  flush=True)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                         capture_output=True, text=True).stdout.strip()
    lines = [
        "# Moving a big table: DUMP, RESTORE, DEBUG RELOAD",
        "",
        "Written by `make bench-tables` (`bench/tables.py --buckets %d --rounds %d`): server "
        "time per entry (INFO commandstats, median of the rounds), one table of %s buckets "
        "against one hash of as many fields, same run. Redis %s, release build, %s, %s "
        "(%d CPUs, shared)." % (n, opts.rounds, format(n, ","), version, platform.machine(),
                                cpu or "unknown CPU", os.cpu_count() or 0),
        "",
        "| value | DUMP ns/entry | RESTORE ns/entry | DEBUG RELOAD ns/entry | payload bytes/entry |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in ("table", "hash"):
        r = results[name]
        lines.append("| %s | %.0f | %.0f | %.0f | %.1f |"
                     % (name, r["dump"], r["restore"], r["reload"], r["bytes"]))
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
