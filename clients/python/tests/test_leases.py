"""Leases and reservations through the sync and asyncio limiters against real servers: the
module's replies, `hold` (waiting, renewing, released on an exception), reserve and settle
exactly once, and the failure policy while the server is down."""

import asyncio
import threading
import time
import unittest

import redis
import redis.asyncio

from redis_rl import Lease, LeaseTimeoutError, Limit, Limiter, ReservationNotOpenError
from redis_rl import asyncio as rl_asyncio
from servers import Cluster, Server

SLOW = Limit(rate=1, capacity=10)  # 1 token a second, burst 10


def count(server, key):
    """RL.LEASES key 10000's in_use, asked of the server directly."""
    with redis.Redis(port=server.port) as admin:
        return admin.execute_command("RL.LEASES", key, 10000)[0]


class Sync(unittest.TestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    def limiter(self, server, **kwargs):
        kwargs.setdefault("on_error", "closed")
        limiter = Limiter(redis.Redis(port=server.port), **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def test_lease_release_renew_leases_reply_as_the_module_does(self):
        s = self.server()
        limiter = self.limiter(s)
        a = limiter.lease("jobs", 2, 30_000)
        b = limiter.lease("jobs", 2, 30_000, id="worker-7")
        again = limiter.lease("jobs", 2, 30_000, id="worker-7")
        denied = limiter.lease("jobs", 2, 30_000)
        self.assertEqual((a.allowed, a.in_use, a.expires_in_ms, a.source), (True, 1, 30_000, "redis"))
        self.assertEqual(len(a.id), 16)
        self.assertEqual((b.id, b.in_use), ("worker-7", 2))
        self.assertEqual((again.allowed, again.id, again.in_use), (True, "worker-7", 2))
        self.assertLessEqual(again.expires_in_ms, 30_000)
        self.assertEqual((denied.allowed, denied.id, denied.in_use), (False, "", 2))
        self.assertTrue(0 < denied.retry_after_ms <= 30_000)
        self.assertEqual(denied.headers(), {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0",
                                            "Retry-After": str(-(-denied.retry_after_ms // 1000))})
        peek = limiter.leases("jobs", 2)
        self.assertEqual((peek.in_use, peek.source), (2, "redis"))
        self.assertTrue(limiter.renew("jobs", a.id, 60_000))
        self.assertTrue(limiter.release("jobs", a.id))
        self.assertFalse(limiter.release("jobs", a.id))
        self.assertFalse(limiter.renew("jobs", a.id, 1000))
        self.assertEqual(limiter.leases("jobs", 2).in_use, 1)
        self.assertEqual(limiter.counters["redis"], 10)
        with self.assertRaisesRegex(ValueError, "limit must be an integer from 1 to 10000"):
            limiter.lease("jobs", 0, 1000)
        with self.assertRaisesRegex(ValueError, "ttl_ms must be an integer"):
            limiter.lease("jobs", 1, 0)
        with self.assertRaisesRegex(ValueError, "id must be 1 to 16 bytes"):
            limiter.release("jobs", "x" * 17)

    def test_a_callers_id_cannot_take_a_policys_prefix(self):
        # Its release or settle would be answered in process, never reaching the Redis lease.
        s = self.server()
        limiter = self.limiter(s)
        for lease_id in ("open:x", "local:x"):
            with self.assertRaisesRegex(ValueError, 'must not start with "open:" or "local:"'):
                limiter.lease("jobs", 1, 1000, id=lease_id)
            with self.assertRaisesRegex(ValueError, 'must not start with "open:" or "local:"'):
                limiter.reserve("t", SLOW, 1, 1000, id=lease_id)
        self.assertEqual(count(s, "jobs"), 0)
        self.assertEqual(limiter.counters["redis"], 0)

    def test_a_with_lease_is_released_on_an_exception(self):
        s = self.server()
        limiter = self.limiter(s)
        with self.assertRaises(RuntimeError):
            with limiter.hold("export", 1, 60_000) as lease:
                self.assertEqual((lease.allowed, count(s, "export")), (True, 1))
                raise RuntimeError("the work failed")
        self.assertEqual(count(s, "export"), 0)
        with limiter.hold("export", 1, 60_000):  # the slot is free again
            self.assertEqual(count(s, "export"), 1)
        self.assertEqual(count(s, "export"), 0)

    def test_hold_waits_for_a_slot_and_times_out_clearly(self):
        s = self.server()
        limiter = self.limiter(s)
        other = limiter.lease("one", 1, 300)  # expires by itself in 300 ms
        started = time.monotonic()
        with self.assertRaises(LeaseTimeoutError) as raised:
            with limiter.hold("one", 1, 10_000, wait=0.1):
                self.fail("no slot was free")
        self.assertGreaterEqual(time.monotonic() - started, 0.1)
        self.assertIn("no lease on 'one' (limit 1) within 0.1 s", str(raised.exception))
        self.assertFalse(raised.exception.lease.allowed)
        with limiter.hold("one", 1, 10_000, wait=2) as lease:  # the first expires meanwhile
            self.assertNotEqual(lease.id, other.id)
            self.assertGreaterEqual(time.monotonic() - started, 0.3)
        self.assertEqual(count(s, "one"), 0)

    def test_hold_renews_while_the_block_runs_and_stops_at_exit(self):
        s = self.server()
        limiter = self.limiter(s)
        with limiter.hold("long", 1, 200) as lease:
            time.sleep(0.6)  # three ttls: held only because it is renewed
            self.assertEqual(count(s, "long"), 1)
            self.assertTrue(limiter.renew("long", lease.id, 200))
        self.assertEqual(count(s, "long"), 0)
        renewals = s.calls("RL.RENEW")
        time.sleep(0.3)
        self.assertEqual(s.calls("RL.RENEW"), renewals)  # the renewer stopped
        self.assertGreaterEqual(renewals, 4)

    def test_reserve_and_settle_exactly_once(self):
        s = self.server()
        limiter = self.limiter(s)
        r = limiter.reserve("job", SLOW, 4, 60_000, id="export-7")
        self.assertEqual((r.allowed, r.id, r.remaining, r.retry_after_ms, r.source),
                         (True, "export-7", 6, 0, "redis"))
        retried = limiter.reserve("job", SLOW, 4, 60_000, id="export-7")
        self.assertEqual((retried.allowed, retried.remaining), (True, 6))  # took nothing more
        first = r.settle(1)  # 3 of the 4 go back
        self.assertEqual((first.applied, first.remaining, first.retry_after_ms, first.source),
                         (True, 9, 0, "redis"))
        self.assertIs(r.settle(1), first)  # once: the same answer, nothing sent
        self.assertEqual(s.calls("RL.SETTLE"), 1)
        with self.assertRaisesRegex(ReservationNotOpenError, "id export-7 is not an open reservation"):
            limiter.settle("job", SLOW, "export-7", 1)
        big = limiter.reserve("job", SLOW, 2, 60_000)
        self.assertEqual((big.allowed, big.remaining, len(big.id)), (True, 7, 16))
        over = big.settle(12)  # 10 more than reserved: into debt
        self.assertEqual(over.remaining, -3)
        self.assertTrue(2000 < over.retry_after_ms <= 3000)
        too_much = limiter.reserve("job", SLOW, 11, 60_000)
        self.assertEqual((too_much.allowed, too_much.id, too_much.retry_after_ms), (False, "", -1))
        with self.assertRaisesRegex(ValueError, "a denied reservation"):
            too_much.settle(1)
        with self.assertRaisesRegex(ValueError, "estimate must be a number above 0"):
            limiter.reserve("job", SLOW, 0, 60_000)
        with self.assertRaisesRegex(ValueError, "actual must be a finite number >= 0"):
            limiter.settle("job", SLOW, "x", -1)

    def test_policies_decide_leases_while_the_server_is_down(self):
        s = self.server()
        limiters = {p: self.limiter(s, on_error=p, timeout_ms=200, probe_interval_ms=60_000)
                    for p in ("open", "closed", "local")}
        held = limiters["local"].lease("k", 1, 60_000)  # taken in Redis before the outage
        s.stop()
        opened = limiters["open"].lease("k", 1, 60_000)
        self.assertEqual((opened.allowed, opened.source), (True, "open"))
        self.assertTrue(opened.id.startswith("open:"))
        self.assertTrue(limiters["open"].release("k", opened.id))
        closed = limiters["closed"].lease("k", 1, 60_000)
        self.assertEqual((closed.allowed, closed.retry_after_ms, closed.source), (False, 1000, "closed"))
        local = limiters["local"]
        first = local.lease("k", 2, 60_000)
        second = local.lease("k", 2, 60_000)
        third = local.lease("k", 2, 60_000)
        self.assertEqual([(x.allowed, x.in_use, x.source) for x in (first, second, third)],
                         [(True, 1, "local"), (True, 2, "local"), (False, 2, "local")])
        self.assertTrue(first.id.startswith("local:"))
        self.assertTrue(0 < third.retry_after_ms <= 60_000)
        self.assertEqual(local.leases("k", 2).in_use, 2)
        self.assertTrue(local.release("k", first.id))
        self.assertFalse(local.release("k", held.id))  # a Redis lease cannot be reached now
        with local.hold("k", 2, 60_000) as lease:
            self.assertEqual((lease.source, local.leases("k", 2).in_use), ("local", 2))
        self.assertEqual(local.leases("k", 2).in_use, 1)
        # Reservations: "local" takes from the local bucket and settles there, exactly.
        r = local.reserve("b", SLOW, 4, 60_000)
        self.assertEqual((r.allowed, r.remaining, r.source), (True, 6, "local"))
        settled = r.settle(1)
        self.assertEqual((settled.applied, settled.remaining, settled.source), (True, 9, "local"))
        with self.assertRaises(ReservationNotOpenError):
            local.settle("b", SLOW, r.id, 1)
        self.assertEqual(limiters["closed"].reserve("b", SLOW, 1, 1000).allowed, False)
        self.assertEqual(limiters["open"].reserve("b", SLOW, 1, 1000).settle(5).applied, False)
        self.assertEqual(limiters["local"].counters["outages"], 1)
        self.assertGreaterEqual(limiters["local"].counters["local"], 9)
        # A lease taken under "local" stays local once Redis is back.
        s.start()
        self.assertTrue(local.release("k", second.id))
        self.assertEqual(local.counters["redis"], 1)


class OnACluster(unittest.TestCase):
    def test_leases_and_reservations_on_keys_of_each_master(self):
        cluster = Cluster(masters=2)
        self.addCleanup(cluster.close)
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.port)
        self.addCleanup(client.close)
        limiter = Limiter(client, on_error="closed")
        for key in ("{a}jobs", "{b}jobs"):  # slots 15495 and 3300: one on each master
            with limiter.hold(key, 1, 10_000) as lease:
                self.assertEqual((lease.allowed, lease.source), (True, "redis"))
                self.assertFalse(limiter.lease(key, 1, 10_000).allowed)
            self.assertEqual(limiter.leases(key, 1).in_use, 0)
            r = limiter.reserve(key + ":tpm", SLOW, 4, 10_000)
            self.assertEqual(r.settle(4).remaining, 10 - 4)
        self.assertEqual(cluster.calls("RL.LEASE"), 4)


class Async(unittest.IsolatedAsyncioTestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    async def limiter(self, server, **kwargs):
        client = redis.asyncio.Redis(port=server.port)
        self.addAsyncCleanup(client.aclose)
        kwargs.setdefault("on_error", "closed")
        return rl_asyncio.Limiter(client, **kwargs)

    async def test_an_async_with_lease_is_released_on_an_exception(self):
        s = self.server()
        limiter = await self.limiter(s)
        with self.assertRaises(RuntimeError):
            async with limiter.hold("export", 1, 60_000) as lease:
                self.assertIsInstance(lease, Lease)
                self.assertEqual(count(s, "export"), 1)
                raise RuntimeError("the work failed")
        self.assertEqual(count(s, "export"), 0)

    async def test_an_async_with_lease_is_released_on_cancellation_and_renewed(self):
        s = self.server()
        limiter = await self.limiter(s)
        inside = asyncio.Event()

        async def work():
            async with limiter.hold("long", 1, 200):
                inside.set()
                await asyncio.sleep(60)

        task = asyncio.ensure_future(work())
        await inside.wait()
        await asyncio.sleep(0.5)  # past two ttls: still held, renewed
        self.assertEqual(count(s, "long"), 1)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertEqual(count(s, "long"), 0)

    async def test_async_hold_waits_then_times_out(self):
        s = self.server()
        limiter = await self.limiter(s)
        await limiter.lease("one", 1, 250)
        with self.assertRaises(LeaseTimeoutError):
            async with limiter.hold("one", 1, 1000, wait=0.05):
                pass
        async with limiter.hold("one", 1, 1000, wait=2) as lease:
            self.assertTrue(lease.allowed)

    async def test_async_reserve_and_settle(self):
        s = self.server()
        limiter = await self.limiter(s)
        r = await limiter.reserve("job", SLOW, 4, 60_000)
        first = await r.settle(1)
        self.assertEqual((r.remaining, first.remaining), (6, 9))
        self.assertIs(await r.settle(1), first)
        with self.assertRaises(ReservationNotOpenError):
            await limiter.settle("job", SLOW, r.id, 1)

class Threads(unittest.TestCase):
    def test_many_tasks_never_hold_more_than_the_limit(self):
        # A plain event loop (IsolatedAsyncioTestCase runs its loop in debug mode, which
        # slows every await several times over).
        s = Server()
        self.addCleanup(s.close)
        state = {"held": 0, "peak": 0}

        async def main():
            client = redis.asyncio.Redis(port=s.port)
            limiter = rl_asyncio.Limiter(client, on_error="closed")

            async def one():
                async with limiter.hold("pool", 5, 10_000, wait=30):
                    state["held"] += 1
                    state["peak"] = max(state["peak"], state["held"])
                    await asyncio.sleep(0.005)
                    state["held"] -= 1

            try:
                await asyncio.gather(*(one() for _ in range(50)))
            finally:
                await client.aclose()

        asyncio.run(main())
        self.assertEqual(state["peak"], 5)
        self.assertEqual(count(s, "pool"), 0)

    def test_threads_never_hold_more_than_the_limit(self):
        s = Server()
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port, max_connections=64), on_error="closed")
        self.addCleanup(limiter.client.close)
        lock, state = threading.Lock(), {"held": 0, "peak": 0}

        def one():
            with limiter.hold("pool", 4, 10_000, wait=30):
                with lock:
                    state["held"] += 1
                    state["peak"] = max(state["peak"], state["held"])
                time.sleep(0.005)
                with lock:
                    state["held"] -= 1

        threads = [threading.Thread(target=one) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(state["peak"], 4)
        self.assertEqual(count(s, "pool"), 0)


if __name__ == "__main__":
    unittest.main()
