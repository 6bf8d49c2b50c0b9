"""Limiter.wait and its asyncio twin against real servers: contention (20 waiters on 5 tokens/s
get their tokens at the bucket's rate), the timeout, "never", cancellation holding no token
(checked with RL.PEEK), the Lua path, and an outage decided by the failure policy."""

import asyncio
import os
import signal
import threading
import time
import unittest

import redis
import redis.asyncio

from redis_rl import Limit, Limiter, WaitCancelledError, WaitNeverError, WaitTimeoutError
from redis_rl.asyncio import Limiter as AsyncLimiter
from servers import Server, free_port

FIVE = Limit(rate=5, capacity=1)  # one token every 200 ms, no burst
SLOW = Limit(rate=0.001, capacity=2)  # no refill while a test runs
# Scheduling delay allowed on a loaded machine, in the contention test's upper bounds only.
SLACK_S = float(os.environ.get("RL_WAIT_SLACK_S", "0.6"))


def peek_remaining(server, key, limit):
    reply = redis.Redis(port=server.port).execute_command("RL.PEEK", key, *limit.args(), "0")
    return reply[1]


class Contention(unittest.TestCase):
    def test_twenty_waiters_on_five_per_second_take_turns_at_the_rate(self):
        # A plain event loop: IsolatedAsyncioTestCase runs its loop in debug mode, whose
        # bookkeeping on every callback would be measured here too.
        s = Server()
        self.addCleanup(s.close)

        async def race():
            client = redis.asyncio.Redis(port=s.port)
            limiter = AsyncLimiter(client, on_error="closed", timeout_ms=5000)
            start = time.monotonic()

            async def one():
                d = await limiter.wait("vendor", FIVE)
                return time.monotonic() - start, d

            try:
                return await asyncio.gather(*(one() for _ in range(20)))
            finally:
                await client.aclose()

        got = sorted(asyncio.run(race()), key=lambda x: x[0])
        times = [t for t, _ in got]
        self.assertTrue(all(d.allowed and d.source == "redis" for _, d in got))
        # One token at once, then one per 200 ms: the 20th is taken 19 intervals later, not
        # sooner (1 ms: the clock's resolution in the module's replies).
        self.assertGreaterEqual(times[-1], 19 * 0.2 - 0.001)
        # The bucket's bound: by any moment t after the start, at most 1 + 5 t tokens.
        for i, t in enumerate(times):
            self.assertGreaterEqual(t, i * 0.2 - 0.001, f"token {i} came early")
        # No idle gap: each token is taken within a retry interval (200 ms, plus 10% jitter)
        # of appearing. The times are read on the client, after the reply, so a loaded
        # machine adds its scheduling delay: SLACK_S is allowed for that, once per gap and
        # once in all (idle time would add up over the 19 gaps; the jitter may).
        gaps = [b - a for a, b in zip(times, times[1:])]
        self.assertLess(max(gaps), 0.2 + 0.22 + SLACK_S, gaps)
        self.assertLess(times[-1], 19 * (0.2 + 0.022) + SLACK_S)
        self.assertEqual(peek_remaining(s, "vendor", FIVE), 0)


class Waits(unittest.IsolatedAsyncioTestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    async def limiter(self, port, **kwargs):
        client = redis.asyncio.Redis(port=port)
        self.addAsyncCleanup(client.aclose)
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 5000)  # a loaded machine must not look like an outage
        return AsyncLimiter(client, **kwargs)

    def sync_limiter(self, port, **kwargs):
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 1000)
        limiter = Limiter(redis.Redis(port=port), **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    async def test_timeout_raises_with_the_last_denial(self):
        s = self.server()
        limiter = await self.limiter(s.port)
        for _ in range(2):
            await limiter.acquire("k", SLOW)
        start = time.monotonic()
        with self.assertRaises(WaitTimeoutError) as caught:
            await limiter.wait("k", SLOW, timeout=0.3)
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertFalse(caught.exception.decision.allowed)
        self.assertGreater(caught.exception.decision.retry_after_ms, 900_000)

    async def test_never_raises_at_once(self):
        for module in (True, False):
            limiter = await self.limiter(self.server(module).port)
            start = time.monotonic()
            with self.assertRaises(WaitNeverError) as caught:
                await limiter.wait("k", SLOW, cost=3)
            self.assertLess(time.monotonic() - start, 0.5)
            self.assertEqual(caught.exception.decision.retry_after_ms, -1)

    async def test_cancelled_while_sleeping_holds_no_token(self):
        s = self.server()
        limiter = await self.limiter(s.port)
        one = Limit(rate=2, capacity=1)  # a token every 500 ms
        await limiter.acquire("k", one)
        task = asyncio.create_task(limiter.wait("k", one))
        await asyncio.sleep(0.1)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.6)  # the token is back and nobody took it
        self.assertEqual(peek_remaining(s, "k", one), 1)

    async def test_cancelled_while_the_take_is_in_flight_refunds_it(self):
        s = self.server()
        limiter = await self.limiter(s.port, timeout_ms=5000)
        await limiter.peek("k", SLOW)  # detect the module before the server pauses
        os.kill(s.proc.pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(limiter.wait("k", SLOW))
            await asyncio.sleep(0.2)  # RL.ACQUIRE is sent and waits for the paused server
            task.cancel()
            await asyncio.sleep(0.1)
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        with self.assertRaises(asyncio.CancelledError):
            await task
        # The take that raced the cancel was allowed (the bucket was full) and given back.
        self.assertEqual(peek_remaining(s, "k", SLOW), 2)
        self.assertEqual(s.calls("rl.acquire"), 1)
        self.assertEqual(s.calls("rl.refund"), 1)

    async def test_lua_path_waits_for_its_token(self):
        limiter = await self.limiter(self.server(module=False).port)
        ten = Limit(rate=10, capacity=1)
        start = time.monotonic()
        got = [await limiter.wait("k", ten) for _ in range(3)]
        self.assertEqual([d.source for d in got], ["lua"] * 3)
        self.assertGreaterEqual(time.monotonic() - start, 0.2 - 0.001)

    async def test_outage_applies_the_failure_policy(self):
        dead = free_port()
        closed = await self.limiter(dead, timeout_ms=100)
        with self.assertRaises(WaitTimeoutError) as caught:
            await closed.wait("k", SLOW, timeout=0.2)
        self.assertEqual(caught.exception.decision.source, "closed")
        local = await self.limiter(dead, on_error="local", timeout_ms=100)
        self.assertEqual((await local.wait("k", SLOW)).source, "local")

    def test_sync_wait_takes_the_token_and_stops_on_cancel(self):
        s = self.server()
        limiter = self.sync_limiter(s.port)
        one = Limit(rate=2, capacity=1)
        start = time.monotonic()
        self.assertTrue(limiter.wait("k", one).allowed)
        self.assertTrue(limiter.wait("k", one).allowed)
        self.assertGreaterEqual(time.monotonic() - start, 0.5 - 0.001)
        with self.assertRaises(WaitTimeoutError):
            limiter.wait("k", one, timeout=0.1)
        cancel = threading.Event()
        threading.Timer(0.1, cancel.set).start()
        with self.assertRaises(WaitCancelledError):
            limiter.wait("k", one, cancel=cancel)
        time.sleep(0.6)
        self.assertEqual(peek_remaining(s, "k", one), 1)
        with self.assertRaises(WaitNeverError):
            limiter.wait("k", one, cost=2)


if __name__ == "__main__":
    unittest.main()
