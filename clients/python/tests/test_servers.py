"""The sync limiter against real servers: with the module, without it (the Lua script), during
outages (each policy, the counters, the log, the way back), and with the deny cache (calls
counted by INFO commandstats). Each test starts its own server(s); see servers.py."""

import logging
import math
import os
import signal
import struct
import time
import unittest

import redis

from redis_rl import Limit, Limiter, ModuleMissingError
from servers import Server

# Slow enough that no refill can happen while a test runs, even on a loaded machine.
SLOW = Limit(rate=0.001, capacity=5)


def sequence(limiter, prefix):
    """One fixed sequence of calls, replied in order: bursts, denials, the impossible, peek,
    refund, cost 0, acquire_all."""
    out = []
    one = Limit(1, 5)
    for cost in (1, 2, 1, 1, 1, 6, 0, 2):  # 5 allowed in all, then a denial, -1, a read, a denial
        out.append(("acquire", cost, limiter.acquire(prefix + "a", one, cost)))
    out.append(("peek", 1, limiter.peek(prefix + "a", one, 1)))
    out.append(("refund", 2, limiter.refund(prefix + "a", one, 2)))
    out.append(("acquire", 2, limiter.acquire(prefix + "a", one, 2)))
    out.append(("acquire", 1, limiter.acquire(prefix + "a", one, 1)))
    tagged = [("{t}" + prefix + "s", Limit(1, 2), 1), ("{t}" + prefix + "h", Limit(0.5, 3), 1),
              ("{t}" + prefix + "s", Limit(1, 2), 1)]
    for _ in range(3):
        out.append(("all", 0, limiter.acquire_all(tagged)))
    return out


def exact_sequence(limiter, prefix):
    """Calls whose answers depend on exact decimals and N/S rates: 100 a minute, 3 per 10 s,
    0.3 per second against cost 3 (the double 0.3 would need a hair over 10 s), tenths."""
    out = []
    for name, limit, costs in (("m", Limit(100, per=60), (60, 40, 1)),
                               ("t", Limit(3, per=10), (1, 1, 1, 1)),
                               ("d", Limit(0.3, 3), (3, 0.1)),
                               ("c", Limit(7, 0.3, per=3), (0.1, 0.1, 0.1, 0.1))):
        for cost in costs:
            out.append(("acquire", cost, limiter.acquire(prefix + name, limit, cost)))
        out.append(("refund", 0.1, limiter.refund(prefix + name, limit, 0.1)))
        out.append(("peek", 0.1, limiter.peek(prefix + name, limit, 0.1)))
    return out


class Servers(unittest.TestCase):
    def server(self, module=True, **kwargs):
        s = Server(module=module, **kwargs)
        self.addCleanup(s.close)
        return s

    def limiter(self, server, **kwargs):
        kwargs.setdefault("on_error", "closed")
        # A deadline generous enough for a loaded machine; the SIGSTOP test sets its own.
        kwargs.setdefault("timeout_ms", 500)
        client = redis.Redis(port=server.port)
        self.addCleanup(client.close)
        limiter = Limiter(client, **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter


class WithModule(Servers):
    def test_e_notation_reaches_the_module_as_exact_decimals(self):
        # repr writes 1e-06, 1e-07 and 1e+16: the module reads each exactly.
        limiter = self.limiter(self.server())
        limit = Limit(1e-06, 2e-07)
        self.assertEqual(limit.args(), ["1e-06", "2e-07"])
        self.assertTrue(limiter.acquire("e", limit, 1e-07).allowed)
        self.assertTrue(limiter.acquire("e", limit, 1e-07).allowed)
        self.assertFalse(limiter.acquire("e", limit, 1e-07).allowed)
        impossible = limiter.acquire("e", Limit(1, 1), 1e16)
        self.assertEqual((impossible.allowed, impossible.retry_after_ms), (False, -1))

    def test_acquire_reports_the_modules_reply(self):
        limiter = self.limiter(self.server())
        first = limiter.acquire("user:42", Limit(5, 10))
        self.assertEqual((first.allowed, first.remaining, first.retry_after_ms), (True, 9, 0))
        self.assertIn(first.reset_after_ms, (199, 200))
        self.assertEqual(first.source, "redis")
        self.assertEqual(limiter.path, "module")
        headers = first.headers()
        self.assertEqual(headers["X-RateLimit-Limit"], "10")
        self.assertEqual(headers["X-RateLimit-Remaining"], "9")
        self.assertEqual(headers["X-RateLimit-Reset"], "1")
        self.assertNotIn("Retry-After", headers)

    def test_denial_has_retry_after_and_impossible_has_minus_one(self):
        limiter = self.limiter(self.server())
        for _ in range(5):
            self.assertTrue(limiter.acquire("k", SLOW).allowed)
        denied = limiter.acquire("k", SLOW)
        self.assertFalse(denied.allowed)
        self.assertGreater(denied.retry_after_ms, 990_000)  # about 1000 s at 0.001/s
        self.assertEqual(denied.headers()["Retry-After"], str(math.ceil(denied.retry_after_ms / 1000)))
        impossible = limiter.acquire("k", SLOW, 6)
        self.assertEqual((impossible.allowed, impossible.retry_after_ms), (False, -1))
        self.assertNotIn("Retry-After", impossible.headers())

    def test_wrong_type_raises_rather_than_applying_the_policy(self):
        s = self.server()
        limiter = self.limiter(s, on_error="open")
        redis.Redis(port=s.port).set("s", "x")
        with self.assertRaisesRegex(redis.ResponseError, "WRONGTYPE"):
            limiter.acquire("s", SLOW)
        self.assertEqual(limiter.counters["open"], 0)

    def test_unknown_command_makes_it_look_again_and_fall_back_to_lua(self):
        s = self.server()
        limiter = self.limiter(s)
        self.assertEqual(limiter.acquire("k", SLOW).source, "redis")
        # The same address comes back without the module (a failover to a server that has
        # none, say): RL.ACQUIRE is now an unknown command.
        s.stop()
        s.module = False
        s.start()
        d = limiter.acquire("k", SLOW)
        self.assertEqual((d.source, d.allowed, d.remaining), ("lua", True, 4))
        self.assertEqual(limiter.path, "lua")


class WithoutModule(Servers):
    def test_lua_gives_the_modules_decisions_for_the_same_calls(self):
        self.assert_same_decisions(sequence)

    def test_decimals_and_periods_decide_alike_on_the_module_and_lua(self):
        with_module, took_ms = self.assert_same_decisions(exact_sequence)
        # Five thirds per second: 100 a minute after 100 are taken, the next in 0.6 s (less
        # the time the calls took).
        minute = with_module[2][2]
        self.assertFalse(minute.allowed)
        self.assertTrue(600 - took_ms - 1 <= minute.retry_after_ms <= 600, minute)
        # 0.3 per second is three tenths: 3 tokens refill in 10 s, not 10.001.
        self.assertEqual(with_module[11][2].reset_after_ms, 10_000)

    def assert_same_decisions(self, calls):
        with_module = self.limiter(self.server(module=True))
        plain = self.limiter(self.server(module=False))
        started = time.monotonic()
        expected = calls(with_module, "")
        middle = time.monotonic()
        got = calls(plain, "")
        took_ms = math.ceil(max(middle - started, time.monotonic() - middle) * 1000)
        self.assertEqual(plain.path, "lua")
        # The two servers decide at different instants: allowed, remaining, refused_index and
        # -1 must agree exactly; waits may differ by the time the sequences took (rounded up).
        for (op, cost, a), (_, _, b) in zip(expected, got):
            what = f"{op} cost {cost}: module {a!r}, lua {b!r}"
            self.assertEqual(getattr(a, "allowed", None), getattr(b, "allowed", None), what)
            if op == "all":
                self.assertEqual(a.refused_index, b.refused_index, what)
                pairs = list(zip(a.decisions, b.decisions))
                self.assertEqual(len(a.decisions), len(b.decisions), what)
            else:
                pairs = [(a, b)]
            for x, y in pairs:
                self.assertEqual(x.remaining, y.remaining, what)
                if op != "refund":
                    self.assertEqual(x.retry_after_ms < 0, y.retry_after_ms < 0, what)
                    self.assertLessEqual(abs(x.retry_after_ms - y.retry_after_ms), took_ms + 1, what)
                self.assertLessEqual(abs(x.reset_after_ms - y.reset_after_ms), took_ms + 1, what)
        self.assertEqual([d.source for _, _, d in got], ["lua"] * len(got))
        return expected, took_ms

    def test_lua_bucket_is_a_string_with_an_absolute_expiry(self):
        s = self.server(module=False)
        limiter = self.limiter(s)
        limiter.acquire("k", Limit(1, 2))
        admin = redis.Redis(port=s.port)
        self.assertEqual(admin.type("k"), b"string")
        # "rl" and three doubles q, r, D: the instant q + r/D µs when the bucket is full (1/s:
        # D = 1, r = 0).
        value = admin.get("k")
        self.assertEqual((len(value), value[:2]), (26, b"rl"))
        q, r, d = struct.unpack("<ddd", value[2:])
        self.assertEqual((r, d), (0.0, 1.0))
        self.assertEqual(q % 1, 0)
        full_at_us = int(q)
        self.assertEqual(admin.pexpiretime("k"), -(-full_at_us // 1000))
        # A full bucket again deletes the key.
        self.assertEqual(limiter.refund("k", Limit(1, 2), 1).remaining, 2)
        self.assertEqual(admin.exists("k"), 0)

    def test_script_is_loaded_again_after_script_flush(self):
        s = self.server(module=False)
        limiter = self.limiter(s)
        limiter.acquire("k", SLOW)
        redis.Redis(port=s.port).script_flush()
        self.assertEqual(limiter.acquire("k", SLOW).remaining, 3)

    def test_refuse_is_a_misconfiguration_check_raises_and_calls_count(self):
        limiter = self.limiter(self.server(module=False), without_module="refuse", on_error="open")
        with self.assertRaisesRegex(ModuleMissingError, "not loaded"):
            limiter.check()
        with self.assertLogs("redis_rl", "ERROR") as logs:
            d = limiter.acquire("k", SLOW)
        self.assertEqual((d.allowed, d.source), (True, "open"))
        self.assertIn("not loaded", logs.output[0])
        self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (1, 0))


class Outage(Servers):
    def outage(self, on_error, module=True, **kwargs):
        """Up, then down for 6 calls, then up again. Returns the decisions while down."""
        s = self.server(module=module)
        limiter = self.limiter(s, on_error=on_error, probe_interval_ms=0, **kwargs)
        self.assertIn(limiter.acquire("warm", SLOW).source, ("redis", "lua"))
        s.stop()
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            down = [limiter.acquire("k", Limit(0.001, 4)) for _ in range(6)]
        self.assertEqual(len(logs.records), 1, logs.output)  # once per outage, not per call
        self.assertIn(f"on_error={on_error!r}", logs.output[0])
        counters = limiter.counters
        self.assertEqual(counters[on_error], 6)
        self.assertEqual(counters["outages"], 1)
        s.start()
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            back = limiter.acquire("k", Limit(0.001, 4))
        self.assertIn("answers again", logs.output[0])
        self.assertIn("6 decisions", logs.output[0])
        self.assertEqual(back.source, "redis" if module else "lua")
        # The restarted server has no data: the bucket there is full.
        self.assertEqual(back.remaining, 3)
        self.assertEqual(limiter.counters[on_error], 6)
        return down

    def test_open_allows_while_redis_is_down(self):
        down = self.outage("open")
        self.assertEqual({(d.allowed, d.source) for d in down}, {(True, "open")})

    def test_closed_denies_while_redis_is_down(self):
        down = self.outage("closed")
        self.assertEqual({(d.allowed, d.source) for d in down}, {(False, "closed")})
        self.assertEqual(down[0].headers()["Retry-After"], "1")

    def test_local_decides_with_a_share_of_the_limit(self):
        # Capacity 4 over 2 instances: 2 tokens locally, then denials.
        down = self.outage("local", instances=2)
        self.assertEqual([d.allowed for d in down], [True, True, False, False, False, False])
        self.assertEqual({d.source for d in down}, {"local"})
        self.assertGreater(down[2].retry_after_ms, 1_000_000)  # 0.0005/s locally: 2000 s

    def test_local_policy_on_the_lua_path(self):
        down = self.outage("local", module=False, instances=4)
        self.assertEqual([d.allowed for d in down], [True, False, False, False, False, False])

    def test_peek_refund_and_acquire_all_use_the_local_policy_too(self):
        s = self.server()
        limiter = self.limiter(s, on_error="local", instances=1, probe_interval_ms=0)
        limiter.acquire("warm", SLOW)
        s.stop()
        limit = Limit(0.001, 2)
        self.assertEqual(limiter.acquire("k", limit).remaining, 1)
        peek = limiter.peek("k", limit)
        self.assertEqual((peek.allowed, peek.remaining, peek.source), (True, 1, "local"))
        refund = limiter.refund("k", limit)
        self.assertEqual((refund.remaining, refund.source), (2, "local"))
        items = [("{t}a", limit, 2), ("{t}b", Limit(0.001, 1), 2)]
        multi = limiter.acquire_all(items)
        self.assertEqual((multi.allowed, multi.refused_index, multi.retry_after_ms, multi.source),
                         (False, 1, -1, "local"))
        self.assertEqual(limiter.peek("{t}a", limit).remaining, 2)  # all or nothing: untouched
        self.assertEqual(limiter.counters["local"], 5)

    def test_a_stopped_server_times_out_into_the_policy(self):
        s = self.server()
        limiter = self.limiter(s, on_error="open", timeout_ms=100, probe_interval_ms=0)
        self.assertEqual(limiter.acquire("k", SLOW).source, "redis")
        os.kill(s.proc.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
        try:
            with self.assertLogs("redis_rl", logging.WARNING) as logs:
                d = limiter.acquire("k", SLOW)
            self.assertIn("Timeout", logs.output[0])
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        self.assertEqual(d.source, "open")
        deadline = time.monotonic() + 10
        while limiter.acquire("k", SLOW).source != "redis":
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)

    def test_oom_and_readonly_replies_apply_the_policy(self):
        for module in (True, False):
            s = self.server(module=module)
            limiter = self.limiter(s, on_error="closed", probe_interval_ms=0)
            admin = redis.Redis(port=s.port)
            self.assertTrue(limiter.acquire("k", SLOW).allowed)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")
            self.assertEqual(limiter.acquire("k2", SLOW).source, "closed", f"OOM, module={module}")
            admin.config_set("maxmemory", "0")
            self.assertNotEqual(limiter.acquire("k2", SLOW).source, "closed")
            # A replica of a master that is not there: read-only.
            admin.execute_command("REPLICAOF", "127.0.0.1", "1")
            self.assertEqual(limiter.acquire("k3", SLOW).source, "closed", f"READONLY, module={module}")
            self.assertEqual(limiter.counters["outages"], 2)


class Shield(Servers):
    def flood(self, module, deny_cache, calls=200):
        s = self.server(module=module)
        limiter = self.limiter(s, deny_cache=deny_cache)
        command = "rl.acquire" if module else "evalsha"
        limit = Limit(0.001, 1)
        self.assertTrue(limiter.acquire("hot", limit).allowed)
        decisions = [limiter.acquire("hot", limit) for _ in range(calls)]
        self.assertFalse(any(d.allowed for d in decisions))
        return s, limiter, decisions, s.calls(command)

    def test_denied_key_stops_reaching_the_server(self):
        for module in (True, False):
            _, limiter, decisions, reached = self.flood(module, deny_cache=True)
            self.assertEqual(reached, 2, f"module={module}")  # the take and the first denial
            self.assertEqual([d.source for d in decisions[1:]], ["cache"] * 199)
            self.assertEqual(limiter.counters["cache"], 199)
            self.assertGreater(decisions[-1].retry_after_ms, 990_000)

    def test_without_the_shield_every_call_reaches_the_server(self):
        _, _, _, reached = self.flood(True, deny_cache=False)
        self.assertEqual(reached, 201)

    def test_smaller_costs_and_refunds_go_to_redis(self):
        s = self.server()
        limiter = self.limiter(s, deny_cache=True)
        limit = Limit(0.001, 3)
        self.assertTrue(limiter.acquire("k", limit, 2).allowed)
        self.assertEqual(limiter.acquire("k", limit, 2).source, "redis")  # denied: remembered
        self.assertEqual(limiter.acquire("k", limit, 3).source, "cache")  # larger: cached
        small = limiter.acquire("k", limit, 1)  # smaller: it may fit, so Redis decides
        self.assertEqual((small.source, small.allowed), ("redis", True))
        limiter.acquire("k", limit, 1)  # denied, remembered for cost 1
        self.assertEqual(limiter.acquire("k", limit, 1).source, "cache")
        limiter.refund("k", limit, 1)
        after = limiter.acquire("k", limit, 1)
        self.assertEqual((after.source, after.allowed), ("redis", True))

    def test_cache_entry_ends_when_retry_after_has_passed(self):
        s = self.server()
        limiter = self.limiter(s, deny_cache=True)
        limit = Limit(20, 1)  # a token every 50 ms
        limiter.acquire("k", limit)
        denied = limiter.acquire("k", limit)
        self.assertEqual(denied.source, "redis")
        time.sleep(denied.retry_after_ms / 1000 + 0.01)
        self.assertEqual(limiter.acquire("k", limit).source, "redis")

    def test_cache_is_bounded(self):
        s = self.server()
        limiter = self.limiter(s, deny_cache=3)
        limit = Limit(0.001, 1)
        for i in range(10):
            limiter.acquire(f"k{i}", limit)
            limiter.acquire(f"k{i}", limit)
        self.assertEqual(len(limiter._engine.cache), 3)
        self.assertEqual(limiter.acquire("k9", limit).source, "cache")
        self.assertEqual(limiter.acquire("k0", limit).source, "redis")


class Validation(unittest.TestCase):
    def test_limits_are_checked_with_the_modules_ranges(self):
        bad = [((0, 1), "rate must be"), ((1e-7, 1), "rate must be"), ((2e9, 1), "rate must be"),
               ((float("nan"), 1), "rate must be"), ((1, 0), "capacity must be"),
               ((1, 2e15), "capacity must be"), ((1e-6, 3154), "capacity / rate"),
               (("x", 1), "rate must be")]
        for args, message in bad:
            with self.assertRaisesRegex(ValueError, message, msg=str(args)):
                Limit(*args)
        Limit(1e-6, 3153)
        Limit(1e9, 1e15)

    def test_policy_has_no_default(self):
        client = redis.Redis(port=1)
        with self.assertRaises(TypeError):
            Limiter(client)  # pylint: disable=missing-kwoa
        with self.assertRaisesRegex(ValueError, "on_error"):
            Limiter(client, on_error="maybe")
        with self.assertRaisesRegex(ValueError, "without_module"):
            Limiter(client, on_error="open", without_module="yes")

    def test_costs_are_checked(self):
        limiter = Limiter(redis.Redis(port=1), on_error="open")
        for cost in (-1, float("inf"), float("nan"), "x"):
            with self.assertRaisesRegex(ValueError, "cost must be"):
                limiter.acquire("k", SLOW, cost)


if __name__ == "__main__":
    unittest.main()
