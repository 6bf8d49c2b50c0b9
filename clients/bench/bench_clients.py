#!/usr/bin/env python3
"""make bench-clients: what the deny cache saves when one client floods a denied key.

For each path (the module; the Lua script on a plain server) and each library (Python sync;
Node with ioredis, through clients/node/bench/flood.mjs), floods one key that Redis has denied, with and without
the shield (deny_cache), one call at a time from one connection. Reports the calls that
reached the server (INFO commandstats) and the p50 and p99 latency of a call, as seen by the
caller. Writes clients/bench/results.md. `--smoke` floods 300 calls per run (CI: checks it
works; nothing here is asserted).

Servers: one redis-server per path, started here on free loopback ports in temp dirs.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import redis  # noqa: E402

from redis_rl import Limit, Limiter  # noqa: E402
import servers  # noqa: E402
from servers import Server  # noqa: E402

LIMIT = Limit(0.001, 1)  # one token, then a denial with retry_after about 1000 s


def percentile(sorted_us, p):
    return sorted_us[min(len(sorted_us) - 1, int(len(sorted_us) * p))]


def flood_python(server, deny_cache, calls, key):
    limiter = Limiter(redis.Redis(port=server.port), on_error="closed", deny_cache=deny_cache,
                      timeout_ms=1000)
    limiter.acquire(key, LIMIT)  # takes the one token
    limiter.acquire(key, LIMIT)  # denied by Redis
    times = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        d = limiter.acquire(key, LIMIT)
        times.append((time.perf_counter_ns() - t) / 1000)
        if d.allowed:
            raise SystemExit("bench: a flooded call was allowed")
    limiter.client.close()
    return sorted(times)


def flood_node(server, deny_cache, calls, key):
    out = subprocess.run(["node", os.path.join(HERE, "..", "node", "bench", "flood.mjs"), str(server.port), key,
                          str(calls), "1" if deny_cache else "0"],
                         capture_output=True, text=True, check=True)
    return sorted(json.loads(out.stdout))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    calls = 300 if args.smoke else 20_000
    node = subprocess.run(["node", "--version"], capture_output=True).returncode == 0 and \
        os.path.isdir(os.path.join(HERE, "..", "node", "node_modules", "ioredis"))
    libraries = [("Python (redis-py, sync)", flood_python)]
    if node:
        libraries.append(("Node (ioredis)", flood_node))
    else:
        print("bench-clients: no node or no clients/node/node_modules; Node skipped")
    rows = []
    for module, path, command in ((True, "module", "rl.acquire"), (False, "Lua script", "evalsha")):
        server = Server(module=module)
        try:
            admin = redis.Redis(port=server.port)
            for name, flood in libraries:
                for deny_cache in (False, True):
                    key = f"hot:{name[:4]}:{deny_cache}"
                    admin.config_resetstat()
                    times = flood(server, deny_cache, calls, key)
                    reached = server.calls(command)
                    rows.append((name, path, "on" if deny_cache else "off", calls, reached,
                                 percentile(times, 0.5), percentile(times, 0.99)))
                    print(f"{name:24} {path:10} shield {rows[-1][2]:3}: {reached:6} of {calls + 2} calls "
                          f"reached Redis; p50 {rows[-1][5]:7.1f} µs, p99 {rows[-1][6]:7.1f} µs", flush=True)
        finally:
            server.close()
    version = subprocess.run([os.environ.get("REDIS_SERVER", "redis-server"), "--version"],
                             capture_output=True, text=True).stdout.split()[2]
    lines = [
        "# bench-clients results", "",
        f"`make bench-clients{' (smoke)' if args.smoke else ''}`: one key flooded with {calls} calls after Redis "
        f"denied it (plus the take and the first denial), one call at a time on one connection, "
        f"Redis {version.removeprefix('v=')} on loopback, Python {platform.python_version()}"
        + (f", Node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}" if node else "")
        + f". Module: {os.path.relpath(servers.MODULE, os.path.join(HERE, '..', '..'))}. Calls reaching Redis are INFO "
        "commandstats; latency is per call, as the caller sees it, on a shared 2-core machine.", "",
        "| library | path | shield | calls | reached Redis | p50 µs | p99 µs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, path, shield, n, reached, p50, p99 in rows:
        lines.append(f"| {name} | {path} | {shield} | {n + 2} | {reached} | {p50:.1f} | {p99:.1f} |")
    if not args.smoke:
        with open(os.path.join(HERE, "results.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("wrote clients/bench/results.md")
    print("bench-clients: done")


if __name__ == "__main__":
    main()
