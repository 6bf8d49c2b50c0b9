#!/usr/bin/env python3
"""Server time of one RL.ACQUIRE.MULTI call as its group count grows (`make bench-multi`).

Starts its own redis-server (the release module, no persistence, a free port, a temp dir,
pinned to one CPU) and, for each size N, sends one RL.ACQUIRE.MULTI of N groups and reads the
server's time for it from INFO commandstats (`usec` of cmdstat_rl.acquire.multi, reset before
each call). Three shapes per size:

  distinct   N different keys (one hash tag), all allowed: N creates and N writes;
  repeated   N groups over N / 10 keys, each key named ten times: the duplicate lookup;
  refused    N distinct keys whose last group asks more than its capacity: everything is
             opened and decided, nothing is written.

Each figure is the median of --rounds calls on a flushed server. A size above the module's cap
is expected to be refused with an error, and is reported as such. Standard library only.

Usage:
  python3 bench/multi.py                          # sizes 1000,10000,30000,100000
  python3 bench/multi.py --sizes 100,1000 --rounds 5
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import DEFAULT_MODULE, BenchError, ErrorReply, Server, encode, parse_stat  # noqa: E402

STAT = "cmdstat_rl.acquire.multi"


def groups(n, shape):
    """The arguments after the command name for one call of `shape` with n groups."""
    args = []
    distinct = max(1, n // 10) if shape == "repeated" else n
    for i in range(n):
        key = "{m}k%d" % (i % distinct)
        cost = "1"
        if shape == "refused" and i == n - 1:
            cost = "11"  # more than the capacity of 10: this call can never be allowed
        args += [key, "1", "10", cost]
    return args


def one_call(conn, n, shape):
    """Server µs of one call on a flushed server, or the error text it answered."""
    conn.call("FLUSHALL")
    conn.call("CONFIG", "RESETSTAT")
    conn.sock.sendall(encode(["RL.ACQUIRE.MULTI"] + groups(n, shape)))
    reply = conn.read()
    if isinstance(reply, ErrorReply):
        return str(reply)
    allowed = reply[0]
    if allowed != (0 if shape == "refused" else 1) or len(reply[3]) != n:
        raise BenchError("unexpected reply for %d %s groups: %r" % (n, shape, reply[:3]))
    # Registered names keep their case in INFO on some servers and are lowered on others.
    stats = {k.lower(): v for k, v in conn.info("commandstats").items()}
    return parse_stat(stats[STAT])["usec"]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,30000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="distinct,repeated,refused")
    parser.add_argument("--module", default=DEFAULT_MODULE)
    parser.add_argument("--redis-server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    parser.add_argument("--server-cpu", type=int, default=0)
    opts = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="redis-rl-bench-multi-")
    server = Server(opts.redis_server, os.path.abspath(opts.module), opts.server_cpu, workdir)
    try:
        conn = server.start()
        conn.sock.settimeout(900)  # an uncapped, quadratic build takes minutes at 100,000
        version = conn.info("server").get("redis_version", "unknown")
        print("redis %s, module %s" % (version, opts.module))
        print("| groups | shape | server time (median of %d) |" % opts.rounds)
        print("| ---: | --- | ---: |")
        for n in (int(s) for s in opts.sizes.split(",")):
            for shape in opts.shapes.split(","):
                results = [one_call(conn, n, shape) for _ in range(opts.rounds)]
                errors = [r for r in results if isinstance(r, str)]
                if errors:
                    cell = "refused: `%s`" % errors[0]
                else:
                    usec = statistics.median(results)
                    cell = "%.2f ms (%.3f µs/group)" % (usec / 1000, usec / n)
                print("| %s | %s | %s |" % (format(n, ","), shape, cell), flush=True)
        conn.close()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
