"""Busy is not down (docs/clients.md, "Busy is not down"): 1,000 concurrent calls, first calls
on a new limiter and then on a warm one, under each policy, sync (threads) and asyncio, get
the module's answers and no policy decision, though they are ten times redis-py's default
pool (100 connections on redis-py 8.x, whose full pool raises MaxConnectionsError). A pool
held full past the deadline is logged as busy and starts no outage; a server that is down
still gets the policy.

Run under redis-py 8.x by run.py; `test_redis_py_5` runs this same file again in a child
process on the redis-py 5.x of RL_REDIS_PY5 (a second pip --target dir, see mk/clients.mk).
"""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import redis
import redis.asyncio

from redis_rl import Limit, Limiter
from redis_rl import asyncio as rl_asyncio
from servers import Server, free_port

CALLS = 1000
POLICIES = ("open", "closed", "local")
# 2 * CALLS tokens and no refill to speak of: every call is allowed, and the remaining counts
# the module gives back are each one value of CALLS * 2 - 1 ... 0, once.
LIMIT = Limit(rate=0.001, capacity=2 * CALLS)
# The deadline only bounds the waiting. A generous one keeps a loaded CI machine from turning
# this into a timing test: the assertion is that no call is decided by the policy while Redis
# answers, which the code before this test broke at once (a full pool was an outage).
DEADLINE_MS = 20_000


def burst_threads(limiter, key):
    start = threading.Barrier(CALLS)
    out = [None] * CALLS

    def one(i):
        start.wait()
        out[i] = limiter.acquire(key, LIMIT)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


async def burst_tasks(limiter, key):
    return await asyncio.gather(*(limiter.acquire(key, LIMIT) for _ in range(CALLS)))


def take_connection(pool):
    """pool.get_connection(), which took a command name before redis-py 5.3."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("PING")


class BusyIsNotDown(unittest.TestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    def assert_module_answered(self, decisions, first_remaining, limiter, policy):
        self.assertEqual({d.source for d in decisions}, {"redis"}, policy)
        self.assertTrue(all(d.allowed for d in decisions), policy)
        self.assertEqual(sorted(d.remaining for d in decisions),
                         list(range(first_remaining - CALLS + 1, first_remaining + 1)), policy)
        counters = limiter.counters
        self.assertEqual((counters["open"], counters["closed"], counters["local"],
                          counters["busy"], counters["outages"]), (0, 0, 0, 0, 0), policy)

    def test_a_thousand_threads_get_the_modules_answers(self):
        for policy in POLICIES:
            s = self.server()
            client = redis.Redis(port=s.port)  # the default pool, as users make it
            limiter = Limiter(client, on_error=policy, timeout_ms=DEADLINE_MS)
            self.addCleanup(limiter.client.close)
            first = burst_threads(limiter, "k")  # first calls: the module is not detected yet
            self.assert_module_answered(first, 2 * CALLS - 1, limiter, policy)
            warm = burst_threads(limiter, "k")
            self.assert_module_answered(warm, CALLS - 1, limiter, policy)
            self.assertEqual(s.calls("rl.acquire"), 2 * CALLS)

    def test_a_thousand_tasks_get_the_modules_answers(self):
        async def run(policy, port):
            client = redis.asyncio.Redis(port=port)  # the default pool, as users make it
            try:
                limiter = rl_asyncio.Limiter(client, on_error=policy, timeout_ms=DEADLINE_MS)
                first = await burst_tasks(limiter, "k")
                warm = await burst_tasks(limiter, "k")
                return limiter, first, warm
            finally:
                await client.aclose()

        for policy in POLICIES:
            s = self.server()
            limiter, first, warm = asyncio.run(run(policy, s.port))
            self.assert_module_answered(first, 2 * CALLS - 1, limiter, policy)
            self.assert_module_answered(warm, CALLS - 1, limiter, policy)
            self.assertEqual(s.calls("rl.acquire"), 2 * CALLS)

    def test_a_server_that_is_down_at_start_gets_the_policy_within_the_deadline(self):
        expected = {"open": (True, "open"), "closed": (False, "closed"), "local": (True, "local")}

        async def tasks(policy, port):
            # A client as users make it: on redis-py 8.x it retries a refused connection with
            # seconds of backoff, which the limiter's deadline (the default, 1 s) cuts short.
            client = redis.asyncio.Redis(port=port)
            try:
                limiter = rl_asyncio.Limiter(client, on_error=policy)
                return limiter, await burst_tasks(limiter, "k")
            finally:
                await client.aclose()

        for policy in POLICIES:
            for kind in ("threads", "tasks"):
                port = free_port()  # nothing listens: connections are refused
                began = time.monotonic()
                if kind == "threads":
                    limiter = Limiter(redis.Redis(port=port), on_error=policy)
                    self.addCleanup(limiter.client.close)
                    with self.assertLogs("redis_rl", logging.WARNING) as logs:
                        got = burst_threads(limiter, "k")
                else:
                    with self.assertLogs("redis_rl", logging.WARNING) as logs:
                        limiter, got = asyncio.run(tasks(policy, port))
                # Not a measurement: a bound far above the 1 s deadline (twice that at most for
                # a thread: the wait for a connection, then for the reply), far below "hangs".
                self.assertLess(time.monotonic() - began, 15, (policy, kind))
                self.assertEqual({(d.allowed, d.source) for d in got}, {expected[policy]}, (policy, kind))
                self.assertEqual(limiter.counters["outages"], 1, (policy, kind))
                self.assertIn("cannot decide", logs.output[0])

    def test_a_server_that_answers_nothing_from_the_start_gets_the_policy(self):
        # SIGSTOP: the kernel still completes connections, nobody replies. Every call ends at
        # its deadline, in the policy: as down (no reply) or busy (queued for a connection
        # held by a call waiting on that reply), never hanging.
        expected = {"open": (True, "open"), "closed": (False, "closed"), "local": (True, "local")}

        async def tasks(policy, port):
            client = redis.asyncio.Redis(port=port)
            try:
                limiter = rl_asyncio.Limiter(client, on_error=policy, timeout_ms=300)
                return limiter, await burst_tasks(limiter, "k")
            finally:
                await client.aclose()

        s = self.server()
        os.kill(s.proc.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, s.proc.pid, signal.SIGCONT)
        for policy in POLICIES:
            for kind in ("threads", "tasks"):
                began = time.monotonic()
                with self.assertLogs("redis_rl", logging.WARNING):
                    if kind == "threads":
                        limiter = Limiter(redis.Redis(port=s.port), on_error=policy, timeout_ms=300)
                        self.addCleanup(limiter.client.close)
                        got = burst_threads(limiter, "k")
                    else:
                        limiter, got = asyncio.run(tasks(policy, s.port))
                self.assertLess(time.monotonic() - began, 15, (policy, kind))  # a bound, not a measurement
                self.assertEqual({(d.allowed, d.source) for d in got}, {expected[policy]}, (policy, kind))
                self.assertEqual(limiter.counters["redis"], 0, (policy, kind))

    def test_a_pool_held_full_past_the_deadline_is_busy_not_an_outage(self):
        s = self.server()
        limiter = Limiter(redis.Redis(port=s.port, max_connections=1), on_error="closed", timeout_ms=200)
        self.addCleanup(limiter.client.close)
        pool = limiter.client.connection_pool
        held = take_connection(pool)  # the pool's only connection, busy elsewhere
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            d = limiter.acquire("k", LIMIT)
        self.assertEqual((d.allowed, d.source), (False, "closed"))
        self.assertIn("busy, not down", logs.output[0])
        self.assertIn("timeout_ms=200", logs.output[0])
        self.assertEqual((limiter.counters["busy"], limiter.counters["outages"]), (1, 0))
        pool.release(held)
        # No outage began, so the very next call goes to Redis (no probe interval to wait).
        self.assertEqual(limiter.acquire("k", LIMIT).source, "redis")

    def test_an_async_pool_held_full_past_the_deadline_is_busy_not_an_outage(self):
        async def run():
            client = redis.asyncio.Redis(port=s.port, max_connections=1)
            try:
                limiter = rl_asyncio.Limiter(client, on_error="closed", timeout_ms=200)
                # Shared with other work: the pool's only connection is taken outside the limiter.
                held = await take_connection(client.connection_pool)
                with self.assertLogs("redis_rl", logging.WARNING) as logs:
                    d = await limiter.acquire("k", LIMIT)
                self.assertEqual((d.allowed, d.source), (False, "closed"))
                self.assertIn("busy, not down", logs.output[0])
                self.assertEqual((limiter.counters["busy"], limiter.counters["outages"]), (1, 0))
                await client.connection_pool.release(held)
                self.assertEqual((await limiter.acquire("k", LIMIT)).source, "redis")
            finally:
                await client.aclose()

        s = self.server()
        asyncio.run(run())

    def test_redis_py_5(self):
        """This file again, in a child process on redis-py 5.x (an unbounded default pool)."""
        if os.environ.get("RL_EXPECT_REDIS_PY") == "5":
            self.assertTrue(redis.__version__.startswith("5."), redis.__version__)
            return
        deps = os.environ.get("RL_REDIS_PY5")
        if not deps:
            self.skipTest("RL_REDIS_PY5 (a pip --target dir holding redis-py 5.x) is not set")
        here = os.path.dirname(os.path.abspath(__file__))
        rl = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p.endswith("python-rl")]
        env = dict(os.environ, RL_EXPECT_REDIS_PY="5", PYTHONPATH=os.pathsep.join(rl + [deps]))
        child = subprocess.run([sys.executable, "-m", "unittest", "test_busy"], cwd=here, env=env,
                               capture_output=True, text=True, timeout=900)
        self.assertEqual(child.returncode, 0, child.stderr[-4000:])
        self.assertIn("OK", child.stderr)


if __name__ == "__main__":
    unittest.main()
