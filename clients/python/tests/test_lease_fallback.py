"""Leases and reservations on the fallback paths (the Functions library redis_rl and the
script), against real servers without the module: the same answers as the module for the same
calls, ids drawn by the client, `hold` released on an exception, a Functions library too old
for leases sending them to the script, and 200 concurrent requests through the ASGI
middleware's in-flight limit."""

import asyncio
import re
import unittest

import redis
import redis.asyncio

import redis_rl
from redis_rl import Limit, Limiter, ReservationNotOpenError
from redis_rl import asgi
from redis_rl import asyncio as rl_asyncio
from servers import Server
from test_in_flight import backoff

SLOW = Limit(rate=1, capacity=10)


def paths():
    """(name, server with the module?, load the Functions library?, expected source)."""
    return (("module", True, False, "redis"), ("functions", False, True, "functions"),
            ("script", False, False, "lua"))


class Fallback(unittest.TestCase):
    def server(self, module, functions):
        s = Server(module=module)
        self.addCleanup(s.close)
        if functions:
            with s.admin() as admin:
                redis_rl.load_functions(admin)
        return s

    def limiter(self, s, **kwargs):
        kwargs.setdefault("on_error", "closed")
        limiter = Limiter(redis.Redis(port=s.port), **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def sequence(self, limiter):
        """The same calls on any path; what they answer, without the clock's parts."""
        out = []
        a = limiter.lease("jobs", 2, 30_000)
        out.append((a.allowed, len(a.id), a.in_use, a.expires_in_ms))
        b = limiter.lease("jobs", 2, 30_000, id="worker-7")
        again = limiter.lease("jobs", 2, 30_000, id="worker-7")
        denied = limiter.lease("jobs", 2, 30_000)
        out.append((b.id, b.in_use, again.allowed, again.in_use, denied.allowed, denied.id, denied.in_use))
        self.assertTrue(0 < denied.retry_after_ms <= 30_000)
        count = limiter.leases("jobs", 2)
        out.append((count.in_use, count.retry_after_ms > 0))
        out.append((limiter.renew("jobs", a.id, 60_000), limiter.release("jobs", a.id),
                    limiter.release("jobs", a.id), limiter.renew("jobs", a.id, 10)))
        out.append(limiter.leases("jobs", 2).in_use)
        r = limiter.reserve("job", SLOW, 4, 60_000, id="export-7")
        retried = limiter.reserve("job", SLOW, 4, 60_000, id="export-7")
        out.append((r.allowed, r.id, r.remaining, r.retry_after_ms, retried.remaining))
        c = r.settle(1)
        out.append((c.applied, c.remaining, c.retry_after_ms))
        with self.assertRaises(ReservationNotOpenError):
            limiter.settle("job", SLOW, "export-7", 1)
        big = limiter.reserve("job", SLOW, 2, 60_000)
        over = big.settle(12)
        out.append((len(big.id), big.remaining, over.remaining, 2000 < over.retry_after_ms <= 3000))
        out.append(limiter.reserve("job", SLOW, 11, 60_000).retry_after_ms)
        with self.assertRaises(RuntimeError):
            with limiter.hold("export", 1, 60_000):
                raise RuntimeError("the work failed")
        out.append(limiter.leases("export", 1).in_use)
        return out

    def test_each_path_answers_as_the_module(self):
        answers = {}
        for name, module, functions, source in paths():
            limiter = self.limiter(self.server(module, functions))
            answers[name] = self.sequence(limiter)
            self.assertEqual(limiter.path, name if name != "script" else "lua")
            self.assertGreater(limiter.counters[source], 10)
        self.assertEqual(answers["functions"], answers["module"])
        self.assertEqual(answers["script"], answers["module"])

    def test_a_string_bucket_becomes_a_hash_with_its_first_record(self):
        """A plain bucket is one string; the reserve that records the first reservation turns
        it into a hash of the bucket's fields and the record, expiring at the bucket's full
        instant; a settle keeps the hash; a refund that fills the bucket deletes the key with
        its open records, as the module does. Every path answers as the module."""
        answers = {}
        for name, module, functions, _ in paths():
            s = self.server(module, functions)
            limiter = self.limiter(s)
            raw = redis.Redis(port=s.port)
            self.addCleanup(raw.close)
            out = [limiter.acquire("job", SLOW, cost=2).remaining]
            if not module:
                self.assertEqual(raw.type("job"), b"string", name)
            r = limiter.reserve("job", SLOW, 3, 60_000, id="first")
            out.append((r.allowed, r.remaining))
            if not module:
                self.assertEqual(raw.type("job"), b"hash", name)
                fields = raw.hgetall("job")
                self.assertEqual(sorted(fields), [b"a", b"b", b"d", b"r:first"], name)
                full_at_us = int(fields[b"a"]) + (1 if int(fields[b"b"]) else 0)
                self.assertEqual(raw.pexpiretime("job"), -(-full_at_us // 1000), name)
            # A plain call on the hash keeps the record; a second reservation joins it.
            out.append(limiter.acquire("job", SLOW).remaining)
            out.append(limiter.reserve("job", SLOW, 1, 60_000, id="second").remaining)
            if not module:
                self.assertEqual(sorted(raw.hgetall("job")),
                                 [b"a", b"b", b"d", b"r:first", b"r:second"], name)
            done = limiter.settle("job", SLOW, "first", 1)
            out.append((done.remaining, done.retry_after_ms > 0))
            if not module:
                self.assertEqual(raw.type("job"), b"hash", name)
                self.assertNotIn(b"r:first", raw.hgetall("job"), name)
            # Refunded to full with "second" still open: the key goes, the record with it.
            out.append(limiter.refund("job", SLOW, cost=10).remaining)
            self.assertEqual(raw.exists("job"), 0, name)
            with self.assertRaises(ReservationNotOpenError):
                limiter.settle("job", SLOW, "second", 1)
            answers[name] = out
        self.assertEqual(answers["functions"], answers["module"])
        self.assertEqual(answers["script"], answers["module"])

    def test_an_old_functions_library_sends_leases_to_the_script(self):
        s = self.server(False, False)
        text = redis_rl.client.functions_text()
        old = re.sub(r"^local VERSION = \d+$", "local VERSION = 1", text, flags=re.MULTILINE)
        with s.admin() as admin:
            admin.execute_command("FUNCTION", "LOAD", "REPLACE", old)
        limiter = self.limiter(s)
        lease = limiter.lease("jobs", 1, 10_000)
        self.assertEqual((lease.allowed, lease.source, limiter.path), (True, "lua", "lua"))
        self.assertTrue(limiter.release("jobs", lease.id))
        self.assertEqual(s.calls("FCALL"), 0)

    def test_a_user_with_the_lease_rules_alone_uses_leases_through_the_library(self):
        from test_paths import add_user, rules

        for name, module, functions, source in paths():
            rule_set = "script" if name == "script" else name
            s = self.server(module, functions)
            with s.admin() as admin:
                add_user(admin, rules(rule_set, part="leases"), name="leaser")
                add_user(admin, rules(rule_set, part="leases"), name="other")
            client = redis.Redis(port=s.port, username="leaser", password="pw")
            self.addCleanup(client.close)
            limiter = Limiter(client, on_error="closed")
            with limiter.hold("jobs", 1, 10_000) as lease:
                self.assertEqual((lease.allowed, lease.source), (True, source), name)
                self.assertEqual(limiter.leases("jobs", 1).in_use, 1)
            self.assertEqual(limiter.leases("jobs", 1).in_use, 0)
            # A reserve needs more than the lease rules: the policy decides, and the log names
            # the rules to add on that path.
            with self.assertLogs("redis_rl", "ERROR") as logs:
                denied = limiter.reserve("tpm", SLOW, 1, 10_000)
            self.assertEqual((denied.allowed, denied.source), (False, "closed"))
            self.assertEqual(limiter.counters["misconfigured"], 1)
            wanted = {"module": "+rl.reserve +rl.settle", "functions": "+hget +hgetall +hdel",
                      "script": "+hget +hgetall +hdel"}[name]
            self.assertIn(wanted, logs.output[0])

    def test_200_concurrent_requests_through_asgi_on_each_fallback(self):
        for name, functions in (("functions", True), ("script", False)):
            s = self.server(False, functions)
            peak = [0, 0]

            async def handler(scope, receive, send):
                peak[0] += 1
                peak[1] = max(peak)
                await asyncio.sleep(0.01)
                peak[0] -= 1
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"ok"})

            async def main():
                client = redis.asyncio.Redis(port=s.port, max_connections=50)
                limiter = rl_asyncio.Limiter(client, on_error="closed", timeout_ms=5000)
                app = asgi.RateLimitMiddleware(handler, limiter=limiter, in_flight=10)
                scope = {"type": "http", "method": "GET", "path": "/", "headers": [],
                         "client": ("203.0.113.7", 5000)}

                async def one():
                    tries = 0
                    while True:
                        statuses = []

                        async def send(message):
                            if message["type"] == "http.response.start":
                                statuses.append(message["status"])

                        async def receive():
                            return {"type": "http.request", "body": b""}

                        await app(dict(scope), receive, send)
                        if statuses == [200]:
                            return
                        await asyncio.sleep(backoff(tries))
                        tries += 1

                try:
                    await asyncio.gather(*(one() for _ in range(200)))
                    return limiter.path
                finally:
                    await client.aclose()

            self.assertEqual(asyncio.run(main()), "functions" if functions else "lua")
            self.assertEqual(peak[1], 10, name)
            with s.admin() as admin:
                self.assertEqual(admin.zcard("rl:http:inflight:10:ip:203.0.113.7"), 0, name)


if __name__ == "__main__":
    unittest.main()
