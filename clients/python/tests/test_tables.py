"""Bucket tables (redis_rl.table) against real servers: the shared vectors (shard hash and
table sequences) on the module's tables and on the Lua fallback, the keys each path writes, the
failure policy during an outage, the deny cache counted by INFO commandstats, and the asyncio
twin. Each test starts its own server(s); see servers.py."""

import json
import logging
import math
import os
import time
import unittest

import redis
import redis.asyncio

from redis_rl import (MAX_BUCKETS_PER_TABLE, Limit, Limiter, ModuleMissingError, ReservationNotOpenError,
                      Table, shard_of, shards_for)
from redis_rl.asyncio import Limiter as AsyncLimiter
from servers import ROOT, Server

VECTORS = os.path.join(ROOT, "clients", "vectors", "table.json")
# Slow enough that no refill can happen while a test runs, even on a loaded machine.
SLOW = Limit(0.001, 2)


def load_vectors():
    with open(VECTORS, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["format"] == 1
    return doc


class ShardVectors(unittest.TestCase):
    def test_fields_map_to_the_shards_and_keys_of_the_vectors(self):
        cases = load_vectors()["shards"]
        self.assertGreater(len(cases), 100)
        for case in cases:
            what = repr(case)
            self.assertEqual(shard_of(case["field"], case["shards"]), case["shard"], what)
            bucket = Table(None, "api", case["shards"]).bucket(case["field"])
            self.assertEqual(bucket.table, case["table_key"], what)
            self.assertEqual(str(bucket), case["fallback_key"], what)
            self.assertEqual(bucket.field, case["field"], what)

    def test_bad_tables_are_refused_where_they_are_written(self):
        for name, shards, error in [("a{b}", 1, "name must not contain"), ("a}", 1, "name must not contain"),
                                    ("", 1, "name must be"), ("t", 0, "shards must be"),
                                    ("t", 16385, "shards must be"), ("t", 1.0, "shards must be"),
                                    ("t", True, "shards must be")]:
            with self.assertRaisesRegex(ValueError, error, msg=(name, shards)):
                Table(None, name, shards)
        with self.assertRaisesRegex(TypeError, "field must be a str"):
            Table(None, "t", 1).bucket(b"bytes")


class Sizing(unittest.TestCase):
    """expected_buckets picks enough shards for MAX_BUCKETS_PER_TABLE buckets each."""

    def test_shards_for_rounds_up_to_whole_tables(self):
        per = MAX_BUCKETS_PER_TABLE
        for expected, shards in [(0, 1), (1, 1), (per - 1, 1), (per, 1), (per + 1, 2), (3 * per, 3),
                                 (3 * per + 1, 4), (10_000 * per, 10_000), (16384 * per, 16384)]:
            self.assertEqual(shards_for(expected), shards, expected)
            table = Table(None, "t", expected_buckets=expected)
            self.assertEqual(table.shards, shards, expected)
            self.assertLessEqual(-(-expected // table.shards), per, expected)

    def test_bad_expected_buckets_are_refused(self):
        for bad, error in [(-1, "non-negative"), (1.5, "non-negative"), (True, "non-negative"),
                           ("10", "non-negative"), (16384 * MAX_BUCKETS_PER_TABLE + 1, "more than the 16384")]:
            with self.assertRaisesRegex(ValueError, "expected_buckets.*" + error, msg=bad):
                Table(None, "t", expected_buckets=bad)

    def test_shards_without_expected_buckets_are_as_given(self):
        self.assertEqual(Table(None, "t").shards, 1)
        self.assertEqual(Table(None, "t", 7).shards, 7)

    def test_too_few_shards_for_the_expected_buckets_warn_and_are_kept(self):
        expected = 3 * MAX_BUCKETS_PER_TABLE + 1
        with self.assertLogs("redis_rl", "WARNING") as logs:
            table = Table(None, "big", 2, expected_buckets=expected)
        self.assertEqual(table.shards, 2)
        self.assertEqual(len(logs.output), 1)
        self.assertIn("'big': 2 shards for %d expected buckets" % expected, logs.output[0])
        self.assertIn("4 shards would keep each under it", logs.output[0])

    def test_enough_shards_for_the_expected_buckets_say_nothing(self):
        with self.assertNoLogs("redis_rl", "WARNING"):
            self.assertEqual(Table(None, "t", 4, expected_buckets=4 * MAX_BUCKETS_PER_TABLE).shards, 4)
            self.assertEqual(Table(None, "t", 9, expected_buckets=1).shards, 9)


def run_sequence(test, table, seq):
    """Runs one vector sequence; returns how long it took (ms, rounded up)."""
    limit = Limit(float(seq["rate"]), float(seq["capacity"]))
    started = time.monotonic()
    for i, step in enumerate(seq["steps"]):
        what = f"{seq['name']} step {i} {step} on {table!r}"
        op = step["op"]
        if op == "delete":
            test.assertEqual(table.delete(*step["fields"]), step["expect"], what)
        elif op == "len":
            test.assertEqual(table.len(), step["expect"], what)
        else:
            got = getattr(table, op)(step["field"], limit, float(step["cost"]))
            check_reply(test, op, got, step["expect"], math.ceil((time.monotonic() - started) * 1000), what)
    return math.ceil((time.monotonic() - started) * 1000)


def check_reply(test, op, got, expect, took_ms, what):
    """allowed, remaining and -1 exactly; the waits within the time the sequence has taken."""
    if op == "refund":
        remaining, reset = expect
        test.assertEqual(got.remaining, remaining, what)
        test.assertLessEqual(abs(got.reset_after_ms - reset), took_ms + 1, what)
        return
    allowed, remaining, retry, reset = expect
    test.assertEqual((got.allowed, got.remaining), (bool(allowed), remaining), what)
    test.assertEqual(got.retry_after_ms < 0, retry < 0, what)
    test.assertLessEqual(abs(got.retry_after_ms - retry), took_ms + 1, what)
    test.assertLessEqual(abs(got.reset_after_ms - reset), took_ms + 1, what)


class Servers(unittest.TestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    def limiter(self, server, **kwargs):
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 500)  # generous for a loaded machine
        client = redis.Redis(port=server.port)
        self.addCleanup(client.close)
        limiter = Limiter(client, **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def admin(self, server):
        client = redis.Redis(port=server.port)
        self.addCleanup(client.close)
        return client


class Sequences(Servers):
    def test_module_tables_give_the_vectors_replies(self):
        s = self.server(module=True)
        limiter = self.limiter(s)
        for seq in load_vectors()["sequences"]:
            run_sequence(self, limiter.table(seq["table"] + ":m", seq["shards"]), seq)
        self.assertEqual(limiter.path, "module")
        self.assertEqual(limiter.counters["lua"], 0)

    def test_lua_fallback_gives_the_vectors_replies(self):
        s = self.server(module=False)
        limiter = self.limiter(s)
        for seq in load_vectors()["sequences"]:
            run_sequence(self, limiter.table(seq["table"] + ":l", seq["shards"]), seq)
        self.assertEqual(limiter.path, "lua")
        self.assertEqual(limiter.counters["redis"], 0)


class Reservations(Servers):
    """A reservation on a table's bucket: RL.HRESERVE / RL.HSETTLE on the table key and field
    with the module; the reserve and settle of the field's own key on the fallback."""

    def check(self, module):
        s = self.server(module=module)
        admin = self.admin(s)
        table = self.limiter(s).table("res", shards=4)
        limit = Limit(0.001, 10)
        r = table.reserve("alice", limit, 4, 60_000)
        source = "redis" if module else "lua"
        self.assertEqual((r.allowed, r.remaining, r.source, len(r.id)), (True, 6, source, 16))
        self.assertEqual(table.peek("alice", limit, 0).remaining, 6)
        self.assertEqual(table.peek("bob", limit, 0).remaining, 10)  # a field of its own
        own = f"res:{{{shard_of('alice', 4)}}}"
        if module:
            self.assertEqual([k.decode() for k in admin.keys("*")], [own])
        else:
            self.assertEqual([k.decode() for k in admin.keys("*")], [f"{own}:alice"])
            self.assertIn(f"r:{r.id}".encode(), admin.hkeys(f"{own}:alice"))
        again = table.reserve("alice", limit, 4, 60_000, id=r.id)  # a retry takes nothing
        self.assertEqual((again.allowed, again.remaining), (True, 6))
        c = r.settle(1)
        self.assertEqual((c.applied, c.remaining, c.source), (True, 9, source))
        self.assertIs(r.settle(1), c)
        with self.assertRaises(ReservationNotOpenError):
            table.settle("alice", limit, r.id, 1)
        if not module:
            self.assertNotIn(f"r:{r.id}".encode(), admin.hkeys(f"{own}:alice"))
        denied = table.reserve("alice", limit, 10, 60_000)
        self.assertEqual((denied.allowed, denied.id), (False, ""))
        under = table.reserve("alice", limit, 2, 60_000, id="job-1")
        self.assertEqual(table.settle("alice", limit, "job-1", 12).remaining, -3)
        self.assertEqual(under.id, "job-1")

    def test_module_reserves_on_the_table_field(self):
        self.check(module=True)

    def test_fallback_reserves_on_the_fields_own_key(self):
        self.check(module=False)


class Keys(Servers):
    def test_module_keeps_one_key_per_shard(self):
        s = self.server(module=True)
        table = self.limiter(s).table("api", shards=4)
        fields = [f"user:{n}" for n in range(40)]
        for field in fields:
            self.assertEqual(table.acquire(field, SLOW).source, "redis")
        admin = self.admin(s)
        used = {f"api:{{{shard_of(f, 4)}}}" for f in fields}
        self.assertEqual(sorted(k.decode() for k in admin.keys("*")), sorted(used))
        for key in used:
            self.assertNotIn(admin.type(key), (b"hash", b"string", b"none"))
            self.assertGreater(admin.execute_command("RL.HLEN", key), 0)
        self.assertEqual(table.len(), 40)

    def test_expected_buckets_spread_the_fields_over_that_many_keys(self):
        s = self.server(module=True)
        table = self.limiter(s).table("sized", expected_buckets=3 * MAX_BUCKETS_PER_TABLE)
        self.assertEqual(table.shards, 3)
        for n in range(60):
            self.assertTrue(table.acquire(f"user:{n}", SLOW).allowed)
        admin = self.admin(s)
        keys = sorted(k.decode() for k in admin.keys("*"))
        self.assertEqual(keys, ["sized:{0}", "sized:{1}", "sized:{2}"])
        self.assertEqual(sum(admin.execute_command("RL.HLEN", k) for k in keys), 60)

    def test_lua_keeps_one_hash_per_field_under_the_shards_hash_tag(self):
        s = self.server(module=False)
        table = self.limiter(s).table("api", shards=4)
        for field in ("a", "b", "c"):
            self.assertEqual(table.acquire(field, SLOW).source, "lua")
        admin = self.admin(s)
        expected = sorted(f"api:{{{shard_of(f, 4)}}}:{f}" for f in ("a", "b", "c"))
        self.assertEqual(sorted(k.decode() for k in admin.keys("*")), expected)
        for key in expected:
            self.assertEqual(admin.type(key), b"string")
            self.assertGreater(admin.pttl(key), 0)
        # A name with glob characters counts only its own keys, and keys SCAN's pattern also
        # matches but no shard below 4 owns do not count.
        other = self.limiter(s).table("a*", shards=4)
        other.acquire("x", SLOW)
        for stray in ("api:{x}:f", "api:{07}:f", "api:{4}:f", "api:{}:f"):
            admin.set(stray, 1)
        self.assertEqual((table.len(), other.len()), (3, 1))

    def test_delete_sends_at_most_a_batch_of_fields_per_command(self):
        for module, command in ((True, "RL.HDEL"), (False, "del")):
            s = self.server(module=module)
            table = self.limiter(s).table("big", shards=2)
            fields = [f"f{n}" for n in range(2500)]
            for field in fields[:1200]:
                table.acquire(field, SLOW)
            self.assertEqual(table.delete(*fields, *fields[:10]), 1200, f"module={module}")
            per_shard = [sum(1 for f in fields if shard_of(f, 2) == i) for i in range(2)]
            self.assertEqual(s.calls(command), sum(-(-n // 1000) for n in per_shard))
            self.assertEqual(table.len(), 0)

    def test_wrong_type_raises_rather_than_applying_the_policy(self):
        s = self.server(module=True)
        table = self.limiter(s, on_error="open").table("t", shards=1)
        self.admin(s).set("t:{0}", "x")
        with self.assertRaisesRegex(redis.ResponseError, "WRONGTYPE"):
            table.acquire("f", SLOW)

    def test_refuse_is_a_misconfiguration(self):
        limiter = self.limiter(self.server(module=False), without_module="refuse")
        table = limiter.table("t")
        with self.assertLogs("redis_rl", "ERROR"):
            self.assertEqual(table.acquire("f", SLOW).source, "closed")
        self.assertEqual(limiter.counters["misconfigured"], 1)
        with self.assertRaisesRegex(ModuleMissingError, "not loaded"):
            table.len()


class Outage(Servers):
    def outage(self, on_error, module=True, **kwargs):
        """Up, then down for 6 calls on one field, then up again; returns the decisions while down."""
        s = self.server(module=module)
        limiter = self.limiter(s, on_error=on_error, probe_interval_ms=0, **kwargs)
        table = limiter.table("t", shards=3)
        source = "redis" if module else "lua"
        self.assertEqual(table.acquire("warm", SLOW).source, source)
        s.stop()
        limit = Limit(0.001, 4)
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            down = [table.acquire("f", limit) for _ in range(6)]
            # Not decisions: they raise rather than pretend.
            with self.assertRaises(redis.ConnectionError):
                table.delete("f")
            with self.assertRaises(redis.ConnectionError):
                table.len()
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertEqual(limiter.counters[on_error], 6)
        s.start()
        back = table.acquire("f", limit)
        self.assertEqual((back.source, back.remaining), (source, 3))  # the restarted server is empty
        return down

    def test_open_allows_while_redis_is_down(self):
        self.assertEqual({(d.allowed, d.source) for d in self.outage("open")}, {(True, "open")})

    def test_closed_denies_while_redis_is_down(self):
        self.assertEqual({(d.allowed, d.source) for d in self.outage("closed")}, {(False, "closed")})

    def test_local_decides_each_field_with_a_share_of_the_limit(self):
        down = self.outage("local", instances=2)
        self.assertEqual([d.allowed for d in down], [True, True, False, False, False, False])
        self.assertEqual({d.source for d in down}, {"local"})

    def test_local_policy_on_the_lua_path(self):
        down = self.outage("local", module=False, instances=4)
        self.assertEqual([d.allowed for d in down], [True, False, False, False, False, False])

    def test_local_buckets_are_per_table_and_field(self):
        s = self.server()
        limiter = self.limiter(s, on_error="local", probe_interval_ms=0)
        a, b = limiter.table("a", 2), limiter.table("b", 2)
        a.acquire("warm", SLOW)
        s.stop()
        one = Limit(0.001, 1)
        self.assertEqual([a.acquire("f", one).allowed, a.acquire("f", one).allowed], [True, False])
        self.assertTrue(a.acquire("g", one).allowed)
        self.assertTrue(b.acquire("f", one).allowed)
        self.assertEqual(a.refund("f", one).remaining, 1)
        self.assertTrue(a.peek("f", one).allowed)


class Shield(Servers):
    def test_denied_field_stops_reaching_the_server(self):
        for module, command in ((True, "RL.HACQUIRE"), (False, "evalsha")):
            s = self.server(module=module)
            limiter = self.limiter(s, deny_cache=True)
            table = limiter.table("hot", shards=4)
            limit = Limit(0.001, 1)
            self.assertTrue(table.acquire("f", limit).allowed)
            decisions = [table.acquire("f", limit) for _ in range(200)]
            self.assertFalse(any(d.allowed for d in decisions))
            # The take and the first denial (the Lua path loads the script before its first EVALSHA).
            self.assertEqual(s.calls(command), 2, f"module={module}")
            self.assertEqual(limiter.counters["cache"], 199)
            # Keyed by table and field: another field, and the same field of another table, ask.
            self.assertTrue(table.acquire("g", limit).allowed)
            self.assertTrue(limiter.table("cold", shards=4).acquire("f", limit).allowed)
            self.assertEqual(s.calls(command), 4)
            # delete resets the bucket and clears the cache entry: the next call asks and is allowed.
            self.assertEqual(table.delete("f"), 1)
            again = table.acquire("f", limit)
            self.assertEqual((again.allowed, again.source), (True, "redis" if module else "lua"))

    def test_without_the_shield_every_call_reaches_the_server(self):
        s = self.server()
        table = self.limiter(s).table("hot")
        for _ in range(50):
            table.acquire("f", Limit(0.001, 1))
        self.assertEqual(s.calls("RL.HACQUIRE"), 50)

    def test_refund_clears_the_entry(self):
        s = self.server()
        table = self.limiter(s, deny_cache=True).table("hot")
        limit = Limit(0.001, 1)
        table.acquire("f", limit)
        self.assertEqual(table.acquire("f", limit).source, "redis")
        self.assertEqual(table.acquire("f", limit).source, "cache")
        self.assertEqual(table.refund("f", limit).remaining, 1)
        self.assertEqual(table.acquire("f", limit).source, "redis")


class Async(unittest.IsolatedAsyncioTestCase):
    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    async def limiter(self, server, **kwargs):
        client = redis.asyncio.Redis(port=server.port)
        self.addAsyncCleanup(client.aclose)
        kwargs.setdefault("timeout_ms", 500)
        return AsyncLimiter(client, **kwargs)

    async def test_both_paths_give_the_vectors_replies(self):
        for module in (True, False):
            limiter = await self.limiter(self.server(module), on_error="closed")
            for seq in load_vectors()["sequences"]:
                table = limiter.table(seq["table"], seq["shards"])
                limit = Limit(float(seq["rate"]), float(seq["capacity"]))
                started = time.monotonic()
                for i, step in enumerate(seq["steps"]):
                    what = f"module={module} {seq['name']} step {i} {step}"
                    if step["op"] == "delete":
                        self.assertEqual(await table.delete(*step["fields"]), step["expect"], what)
                    elif step["op"] == "len":
                        self.assertEqual(await table.len(), step["expect"], what)
                    else:
                        got = await getattr(table, step["op"])(step["field"], limit, float(step["cost"]))
                        took_ms = math.ceil((time.monotonic() - started) * 1000)
                        check_reply(self, step["op"], got, step["expect"], took_ms, what)
            self.assertEqual(limiter.path, "module" if module else "lua")

    async def test_reserve_and_settle_on_both_paths(self):
        for module in (True, False):
            limiter = await self.limiter(self.server(module), on_error="closed")
            table = limiter.table("res", 2)
            limit = Limit(0.001, 10)
            r = await table.reserve("alice", limit, 4, 60_000)
            self.assertEqual((r.allowed, r.remaining, r.source), (True, 6, "redis" if module else "lua"))
            c = await r.settle(7)
            self.assertEqual((c.applied, c.remaining), (True, 3))
            self.assertIs(await r.settle(7), c)
            with self.assertRaises(ReservationNotOpenError):
                await table.settle("alice", limit, r.id, 1)
            self.assertEqual((await table.peek("alice", limit, 0)).remaining, 3)

    async def test_outage_applies_the_policy_then_returns_to_redis(self):
        s = self.server()
        limiter = await self.limiter(s, on_error="local", instances=2, probe_interval_ms=0)
        table = limiter.table("t", 2)
        self.assertEqual((await table.acquire("warm", SLOW)).source, "redis")
        s.stop()
        with self.assertLogs("redis_rl", logging.WARNING):
            down = [await table.acquire("f", Limit(0.001, 4)) for _ in range(3)]
        self.assertEqual([(d.allowed, d.source) for d in down], [(True, "local")] * 2 + [(False, "local")])
        with self.assertRaises((redis.ConnectionError, OSError)):
            await table.len()
        s.start()
        for _ in range(100):
            back = await table.acquire("f", Limit(0.001, 4))
            if back.source == "redis":
                break
            await asyncio_sleep(0.05)
        self.assertEqual((back.source, back.remaining), ("redis", 3))

    async def test_deny_cache_keeps_a_denied_field_off_the_server(self):
        s = self.server()
        table = (await self.limiter(s, on_error="closed", deny_cache=True)).table("hot", 8)
        limit = Limit(0.001, 1)
        for _ in range(100):
            await table.acquire("f", limit)
        self.assertEqual(s.calls("RL.HACQUIRE"), 2)


async def asyncio_sleep(seconds):
    import asyncio

    await asyncio.sleep(seconds)


if __name__ == "__main__":
    unittest.main()
