"""redis_rl.asyncio against real servers: the same paths as the sync limiter (module, Lua,
outage with its policy and the way back, the deadline, the deny cache), awaited."""

import asyncio
import logging
import os
import signal
import unittest

import redis.asyncio

from redis_rl import Limit
from redis_rl.asyncio import Limiter
from servers import Server

SLOW = Limit(rate=0.001, capacity=3)


class Async(unittest.IsolatedAsyncioTestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    async def limiter(self, server, **kwargs):
        client = redis.asyncio.Redis(port=server.port)
        self.addAsyncCleanup(client.aclose)
        kwargs.setdefault("timeout_ms", 500)  # generous for a loaded machine
        return Limiter(client, **kwargs)

    async def test_module_and_lua_paths_decide_alike(self):
        for module, source in ((True, "redis"), (False, "lua")):
            limiter = await self.limiter(self.server(module), on_error="closed")
            got = [await limiter.acquire("k", SLOW) for _ in range(4)]
            self.assertEqual([(d.allowed, d.remaining, d.source) for d in got],
                             [(True, 2, source), (True, 1, source), (True, 0, source), (False, 0, source)])
            self.assertEqual((await limiter.peek("k", SLOW)).allowed, False)
            self.assertEqual((await limiter.refund("k", SLOW)).remaining, 1)
            multi = await limiter.acquire_all([("{a}1", SLOW, 3), ("{a}2", SLOW, 4)])
            self.assertEqual((multi.allowed, multi.refused_index, multi.retry_after_ms), (False, 1, -1))

    async def test_a_limit_per_period_decides_alike_on_the_module_lua_and_local(self):
        # 3 a day (sent as 3/86400) with a burst of 0.3: three tenths fit, and a refunded
        # tenth fits again; no tenth refills while the test runs.
        limit = Limit(3, 0.3, per=86400)
        for module, source in ((True, "redis"), (False, "lua"), (True, "local")):
            s = self.server(module)
            limiter = await self.limiter(s, on_error="local", probe_interval_ms=0)
            if source == "local":
                s.stop()  # the Local policy's exact bucket decides
            got = [await limiter.acquire("d", limit, 0.1) for _ in range(4)]
            await limiter.refund("d", limit, 0.1)
            got.append(await limiter.acquire("d", limit, 0.1))
            self.assertEqual([(d.allowed, d.source) for d in got],
                             [(True, source)] * 3 + [(False, source), (True, source)])

    async def test_outage_applies_the_policy_then_returns_to_redis(self):
        s = self.server()
        limiter = await self.limiter(s, on_error="local", instances=3, probe_interval_ms=0)
        self.assertEqual((await limiter.acquire("k", SLOW)).source, "redis")
        s.stop()
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            down = [await limiter.acquire("k", SLOW) for _ in range(3)]
        self.assertEqual(len(logs.records), 1)
        self.assertEqual([(d.allowed, d.source) for d in down],
                         [(True, "local"), (False, "local"), (False, "local")])
        self.assertEqual((limiter.counters["local"], limiter.counters["outages"]), (3, 1))
        s.start()
        self.assertEqual((await limiter.acquire("k", SLOW)).source, "redis")

    async def test_deadline_bounds_a_server_that_does_not_answer(self):
        s = self.server()
        limiter = await self.limiter(s, on_error="open", timeout_ms=100, probe_interval_ms=0)
        await limiter.acquire("k", SLOW)
        os.kill(s.proc.pid, signal.SIGSTOP)
        try:
            with self.assertLogs("redis_rl", logging.WARNING):
                d = await limiter.acquire("k", SLOW)
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        self.assertEqual(d.source, "open")

    async def test_deny_cache_keeps_a_denied_key_off_the_server(self):
        s = self.server()
        limiter = await self.limiter(s, on_error="closed", deny_cache=True)
        for _ in range(3):
            await limiter.acquire("hot", SLOW)
        got = [await limiter.acquire("hot", SLOW) for _ in range(50)]
        self.assertEqual({d.source for d in got[1:]}, {"cache"})
        self.assertEqual(s.calls("rl.acquire"), 4)


if __name__ == "__main__":
    unittest.main()
