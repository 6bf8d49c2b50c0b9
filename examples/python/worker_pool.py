"""Outbound throttling with Limiter.wait: a pool of workers shares one vendor's limit.

The vendor allows 10 calls per second across all our workers and processes. Each worker
waits for its turn (`limiter.wait`) instead of calling and getting a 429: the bucket in Redis
hands out tokens at exactly the vendor's rate, whichever worker or process asks.

    python3 worker_pool.py   # 30 jobs, 8 workers (REDIS_URL, default redis://127.0.0.1:6379)
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from redis_rl import Limit, Limiter, connect

VENDOR = Limit(rate=10, capacity=1)  # 10 calls per second, no burst


def call_vendor(job: int) -> int:
    """A stand-in for the vendor's API."""
    return job * job


def run(redis_url: str, jobs: Iterable[int], workers: int = 8, limit: Limit = VENDOR,
        key: str = "vendor:acme", timeout: float = 30) -> list[int]:
    """Runs `jobs` through `workers` threads, each call after its token; returns the results
    in order. A job that cannot get a token within `timeout` s raises WaitTimeoutError."""
    limiter = Limiter(connect(redis_url, timeout_ms=500), on_error="closed")

    def one(job: int) -> int:
        limiter.wait(key, limit, timeout=timeout)
        return call_vendor(job)

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, jobs))


if __name__ == "__main__":
    start = time.monotonic()
    results = run(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"), range(30))
    print(f"{len(results)} calls in {time.monotonic() - start:.2f} s (10 per second)")
