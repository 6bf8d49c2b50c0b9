#!/usr/bin/env python3
"""Renders the panels of redis-rl-envoy.json from a real run, without Grafana.

It drives traffic through a running redis-rl-envoy (POST /json) for a while, scrapes its
Prometheus page every few seconds, evaluates each panel's queries on those samples, and
draws the panels on the dashboard's grid with matplotlib. It is a rendering of the
dashboard's queries from real data, not a Grafana screenshot.

The queries it evaluates are the two shapes the dashboard uses (anything else is an error):
  sum[ by (labels) ](rate(metric[{matchers}][$__rate_interval]))
  histogram_quantile(q, sum by (le[, labels]) (rate(metric_bucket[$__rate_interval])))
`$__rate_interval` is WINDOW_S here; label matchers are dropped (every domain is drawn).

    python3 deploy/grafana/render.py --http 127.0.0.1:8080 --metrics 127.0.0.1:9090 \
        --out docs/img/envoy-dashboard.png

Without --http it starts its own: `redis-server` with the module (--module) and the service
(--service) on free loopback ports, with render-config.yaml beside this file, and stops them
at the end:

    python3 deploy/grafana/render.py --module target/debug/libredis_rl.so \
        --service target/debug/redis-rl-envoy

(matplotlib from PyPI: `pip install matplotlib`.) See docs/envoy.md#dashboard.
"""

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict

WINDOW_S = 10.0

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([^ ]+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
SUM_RATE = re.compile(
    r'^sum(?: by \(([^)]*)\) )?\(rate\(([a-z_]+)(?:\{[^}]*\})?\[\$__rate_interval\]\)\)$')
QUANTILE = re.compile(
    r'^histogram_quantile\(([0-9.]+), sum by \(le(?:, ([^)]*))?\) '
    r'\(rate\(([a-z_]+_bucket)\[\$__rate_interval\]\)\)\)$')


def scrape(address):
    """The page as {(name, ((label, value), ...)): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def post(address, body):
    request = urllib.request.Request(f"http://{address}/json", data=json.dumps(body).encode(),
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def descriptor(domain, *entries):
    return {"domain": domain,
            "descriptors": [{"entries": [{"key": k, "value": v} for k, v in entries]}]}


def drive(address, stop, seed):
    """One client: users under a per-second limit, logins under a per-minute one (by IP,
    `detailed_metric`), a shadow-mode search limit, and now and then a malformed body."""
    rng = random.Random(seed)
    while not stop.is_set():
        pick = rng.random()
        if pick < 0.55:
            post(address, descriptor("shop", ("user", f"u{rng.randint(1, 4)}")))
        elif pick < 0.75:
            post(address, descriptor("shop", ("login", f"10.0.0.{rng.randint(1, 3)}")))
        elif pick < 0.97:
            post(address, descriptor("shop", ("search", "q")))
        else:
            post(address, {"domain": 5})
        time.sleep(rng.uniform(0.002, 0.02))


def rate(samples, i, key):
    """Per-second increase of one series over the window ending at sample i."""
    t_now, now = samples[i]
    j = i
    while j > 0 and t_now - samples[j - 1][0] <= WINDOW_S + 0.5:
        j -= 1
    t_then, then = samples[j]
    if t_now - t_then <= 0 or key not in now:
        return None
    return max(0.0, now[key] - then.get(key, 0.0)) / (t_now - t_then)


def quantile(q, buckets):
    """Prometheus's histogram_quantile on [(upper bound, cumulative rate)]."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def evaluate(expr, samples):
    """{legend labels: [(t, value)]} of one query over the run."""
    series = defaultdict(list)
    t0 = samples[0][0]
    m, h = SUM_RATE.match(expr), QUANTILE.match(expr)
    if not (m or h):
        raise SystemExit(f"render.py cannot evaluate: {expr}")
    for i in range(1, len(samples)):
        t, now = samples[i]
        groups = defaultdict(list)
        if m:
            by = [b.strip() for b in (m.group(1) or "").split(",") if b.strip()]
            for (name, labels), _ in now.items():
                if name != m.group(2):
                    continue
                d = dict(labels)
                r = rate(samples, i, (name, labels))
                if r is not None:
                    groups[tuple((b, d.get(b, "")) for b in by)].append(r)
            for g, rates in groups.items():
                series[g].append((t - t0, sum(rates)))
        else:
            by = [b.strip() for b in (h.group(2) or "").split(",") if b.strip()]
            for (name, labels), _ in now.items():
                if name != h.group(3):
                    continue
                d = dict(labels)
                r = rate(samples, i, (name, labels))
                if r is not None:
                    groups[tuple((b, d.get(b, "")) for b in by)].append((float(d["le"]), r))
            for g, buckets in groups.items():
                merged = defaultdict(float)
                for bound, r in buckets:
                    merged[bound] += r
                value = quantile(float(h.group(1)), list(merged.items()))
                if value is not None:
                    series[g].append((t - t0, value))
    return series


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_own(args):
    """redis-server with the module and the service on free ports; their processes."""
    root = tempfile.mkdtemp(prefix="render-")
    os.makedirs(os.path.join(root, "config"))
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copy(os.path.join(here, "render-config.yaml"), os.path.join(root, "config", "shop.yaml"))
    redis_port, http_port, grpc_port, metrics_port = (free_port() for _ in range(4))
    redis = subprocess.Popen([args.redis_server, "--port", str(redis_port), "--save", "",
                              "--appendonly", "no", "--loadmodule", os.path.abspath(args.module)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    env = {"PATH": os.environ.get("PATH", ""), "RUNTIME_ROOT": root,
           "RUNTIME_WATCH_ROOT": "false", "REDIS_SOCKET_TYPE": "tcp",
           "REDIS_URL": f"127.0.0.1:{redis_port}", "HOST": "127.0.0.1", "PORT": str(http_port),
           "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(grpc_port), "USE_PROMETHEUS": "true",
           "PROMETHEUS_ADDR": f"127.0.0.1:{metrics_port}", "USE_STATSD": "false",
           "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(free_port())}
    service = subprocess.Popen([args.service], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit("the service did not come up")
    args.http, args.metrics = f"127.0.0.1:{http_port}", f"127.0.0.1:{metrics_port}"
    return [service, redis]


def legend(fmt, group):
    d = dict(group)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt).strip() or "value"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http", help="the service's HOST:PORT (/json); else start one")
    parser.add_argument("--metrics", help="its PROMETHEUS_ADDR")
    parser.add_argument("--module", default="target/debug/libredis_rl.so")
    parser.add_argument("--service", default="target/debug/redis-rl-envoy")
    parser.add_argument("--redis-server", default="redis-server")
    parser.add_argument("--dashboard", default="deploy/grafana/redis-rl-envoy.json")
    parser.add_argument("--out", default="docs/img/envoy-dashboard.png")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=2)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.load(open(args.dashboard))
    own = [] if args.http else start_own(args)
    if not args.metrics:
        raise SystemExit("--metrics is needed with --http")
    stop = threading.Event()
    clients = [threading.Thread(target=drive, args=(args.http, stop, n), daemon=True)
               for n in range(args.clients)]
    samples = [(time.time(), scrape(args.metrics))]
    for c in clients:
        c.start()
    end = time.time() + args.seconds
    while time.time() < end:
        time.sleep(args.every)
        samples.append((time.time(), scrape(args.metrics)))
    stop.set()
    for c in clients:
        c.join()
    for process in own:
        process.terminate()
        process.wait()

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(12, rows * 0.36))
    grid = fig.add_gridspec(rows, 24, hspace=2.2, wspace=3, top=0.95, bottom=0.05)
    units = {"reqps": "per s", "ops": "per s", "s": "seconds"}
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"] + 1:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        for target in p["targets"]:
            for group, points in sorted(evaluate(target["expr"], samples).items()):
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, linewidth=1.2, label=legend(target["legendFormat"], group))
        ax.set_title(p["title"], fontsize=9, loc="left")
        ax.set_ylabel(units.get(p["fieldConfig"]["defaults"]["unit"], ""), fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
    fig.suptitle(f"{dashboard['title']}: the dashboard's queries on a real {args.seconds:.0f} s run "
                 f"(rate window {WINDOW_S:.0f} s; not a Grafana screenshot)", fontsize=10)
    fig.supxlabel("seconds into the run", fontsize=8)
    fig.savefig(args.out, dpi=72, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
