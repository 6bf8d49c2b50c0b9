"""Post-paid charges (`Limiter.charge`, `Table.charge`): the pure bucket's exact charge
against hand-worked rationals at rates whose 1e9/rate is not whole (3/s, "3/10"), the failure
policies when Redis cannot be reached, and the module's RL.CHARGE / RL.HCHARGE and the Lua
script's "charge" mode on real servers (sync and asyncio). See servers.py."""

import asyncio
import logging
import unittest
from fractions import Fraction

import redis
import redis.asyncio

from redis_rl import Charge, DebtTooLongError, Limit, Limiter, bucket
from redis_rl._core import MAX_DEBT_NS
from redis_rl.asyncio import Limiter as AsyncLimiter
from servers import Server, free_port

T0_US = 1_700_000_000_000_000
# Slow enough that no refill can matter while a test against a server runs.
SLOW = Limit(0.001, 2)


class PureCharge(unittest.TestCase):
    def test_a_charge_at_3_per_s_goes_into_debt_and_is_repaid_exactly(self):
        rate, capacity = Fraction(3), Fraction(2)
        # 5 tokens on a full bucket of 2: balance -3; the debt of 3 tokens is 3 x 1e9/3 ns =
        # exactly 1 s; full again after 5 x 1e9/3 ns = 1666.67 ms, rounded up.
        reply, state = bucket.charge(rate, capacity, None, T0_US, Fraction(5), MAX_DEBT_NS)
        self.assertEqual(reply, (1, -3, 1000, 1667))
        # In debt, a check of cost 0 is denied until the debt is repaid, to the nanosecond:
        # 1 µs before, 1 ns of debt rounds up to a 1 ms wait.
        got, same = bucket.acquire(rate, capacity, state, T0_US + 999_999, Fraction(0))
        self.assertEqual(got[0], 0)
        self.assertEqual(got[2], 1)
        self.assertIs(same, state)
        got, _ = bucket.acquire(rate, capacity, state, T0_US + 1_000_000, Fraction(0))
        self.assertEqual(got[:3], (1, 0, 0))
        # Half a second in: 2 - 3.5 = -1.5 tokens, rounded toward -infinity for a peek, to 0
        # for a take (what X-RateLimit-Remaining reads).
        self.assertEqual(bucket.acquire(rate, capacity, state, T0_US + 500_000, Fraction(1), take=False)[0][1], -2)
        self.assertEqual(bucket.acquire(rate, capacity, state, T0_US + 500_000, Fraction(1))[0][1], 0)

    def test_a_charge_at_3_per_10_s_adds_to_the_debt_already_there(self):
        rate, capacity = Fraction(3, 10), Fraction(1)
        reply, state = bucket.charge(rate, capacity, None, T0_US, Fraction(2), MAX_DEBT_NS)
        # T = 10/3 s: balance -1, repaid after T (3333.33 ms), full after 2T.
        self.assertEqual(reply, (1, -1, 3334, 6667))
        reply, state = bucket.charge(rate, capacity, state, T0_US, Fraction(1, 10), MAX_DEBT_NS)
        # 2.1 tokens owed on a capacity of 1: balance floor(-1.1) = -2, repaid after 1.1 T.
        self.assertEqual(reply, (1, -2, 3667, 7000))
        self.assertEqual(state, Fraction(T0_US * 1000) + Fraction(21, 10) * Fraction(10**10, 3))

    def test_a_charge_of_zero_changes_nothing_and_reports_the_balance(self):
        rate, capacity = Fraction(7), Fraction(3)
        _, state = bucket.charge(rate, capacity, None, T0_US, Fraction(4), MAX_DEBT_NS)
        reply, same = bucket.charge(rate, capacity, state, T0_US, Fraction(0), MAX_DEBT_NS)
        self.assertIs(same, state)
        # 4/7 s to full; 1/7 s of debt: 142.857 ms rounds up.
        self.assertEqual(reply, (1, -1, 143, 572))
        self.assertEqual(bucket.charge(rate, capacity, None, T0_US, Fraction(0), MAX_DEBT_NS)[0], (1, 3, 0, 0))

    def test_a_charge_past_a_hundred_years_of_debt_is_refused(self):
        rate, capacity = Fraction(1), Fraction(1)
        bound_tokens = MAX_DEBT_NS / 10**9  # one token a second: 3153600000 tokens
        reply, _ = bucket.charge(rate, capacity, None, T0_US, bound_tokens, MAX_DEBT_NS)
        self.assertEqual(reply[1], 1 - bound_tokens)
        with self.assertRaisesRegex(DebtTooLongError, "^cost would leave the bucket in debt"):
            bucket.charge(rate, capacity, None, T0_US, bound_tokens + Fraction(1, 10**6), MAX_DEBT_NS)
        local = bucket.LocalBuckets(1)
        with self.assertRaises(ValueError):
            local.charge("k", Limit(1, 1), int(bound_tokens) + 1, T0_US, MAX_DEBT_NS)
        self.assertEqual(len(local), 0)  # nothing was written


class Outage(unittest.TestCase):
    """A port nothing listens on: every call is refused, and the policy decides."""

    def limiter(self, on_error):
        return Limiter(redis.Redis(port=free_port()), on_error=on_error)

    def test_local_applies_the_charge_to_the_local_bucket(self):
        limiter = self.limiter("local")
        c = limiter.charge("k", SLOW, 5)
        self.assertIsInstance(c, Charge)
        self.assertEqual((c.applied, c.source, c.remaining, c.in_debt), (True, "local", -3, True))
        self.assertGreater(c.retry_after_ms, 0)
        # The local bucket now denies every take, a cost of 0 included.
        self.assertFalse(limiter.acquire("k", SLOW, 0).allowed)
        peeked = limiter.peek("k", SLOW, 0)
        self.assertEqual(peeked.remaining, -3)
        # A header field is never negative: the balance shows as 0 there.
        self.assertEqual(peeked.headers()["X-RateLimit-Remaining"], "0")

    def test_open_and_closed_apply_nothing_and_say_so(self):
        for policy in ("open", "closed"):
            limiter = self.limiter(policy)
            with self.assertLogs("redis_rl", logging.WARNING) as logs:
                c = limiter.charge("usage:42", SLOW, 7)
            self.assertEqual((c.applied, c.source), (False, policy))
            self.assertTrue(any("charge of 7 on 'usage:42' was not applied" in m for m in logs.output), logs.output)
            self.assertEqual(limiter.counters["unapplied_charges"], 1)

    def test_a_bad_cost_is_refused_before_any_call(self):
        limiter = self.limiter("local")
        for cost in (-1, float("nan"), "x"):
            with self.assertRaisesRegex(ValueError, "cost must be"):
                limiter.charge("k", SLOW, cost)
        self.assertEqual(limiter.counters["local"], 0)


class OnServers(unittest.TestCase):
    """RL.CHARGE and RL.HCHARGE with the module; the script's "charge" mode without it."""

    def check_paths(self, module):
        server = Server(module=module)
        self.addCleanup(server.close)
        limiter = Limiter(redis.Redis(port=server.port), on_error="closed")
        source = "redis" if module else "lua"
        c = limiter.charge("k", SLOW, 5)
        self.assertEqual((c.applied, c.source, c.remaining), (True, source, -3))
        # 3 tokens of debt at one per 1000 s, and 5 to full: waits of 3000 s and 5000 s (the
        # few ms the test takes are on the server's clock).
        self.assertLessEqual(abs(c.retry_after_ms - 3_000_000), 100)
        self.assertLessEqual(abs(c.reset_after_ms - 5_000_000), 100)
        d = limiter.acquire("k", SLOW, 0)
        self.assertEqual((d.allowed, d.remaining), (False, 0))
        self.assertEqual(limiter.peek("k", SLOW, 0).remaining, -3)
        with self.assertRaisesRegex(DebtTooLongError, "cost would leave the bucket in debt"):
            limiter.charge("k", SLOW, 4_000_000)
        self.assertEqual(limiter.peek("k", SLOW, 0).remaining, -3)  # nothing was written
        table = limiter.table("usage", shards=2)
        c = table.charge("alice", SLOW, 3)
        self.assertEqual((c.applied, c.source, c.remaining), (True, source, -1))
        self.assertFalse(table.acquire("alice", SLOW).allowed)
        self.assertEqual(table.peek("alice", SLOW, 0).remaining, -1)
        self.assertEqual(limiter.counters[source], 7)

    def test_module_path(self):
        self.check_paths(module=True)

    def test_lua_path(self):
        self.check_paths(module=False)

    def test_asyncio_limiter_charges_and_tables_too(self):
        server = Server(module=True)
        self.addCleanup(server.close)

        async def run():
            client = redis.asyncio.Redis(port=server.port)
            try:
                limiter = AsyncLimiter(client, on_error="closed")
                c = await limiter.charge("k", SLOW, 4)
                self.assertEqual((c.applied, c.source, c.remaining), (True, "redis", -2))
                self.assertFalse((await limiter.acquire("k", SLOW, 0)).allowed)
                c = await limiter.table("usage").charge("bob", SLOW, 2)
                self.assertEqual((c.applied, c.remaining), (True, 0))
                with self.assertRaises(DebtTooLongError):
                    await limiter.charge("k", SLOW, 4_000_000)
            finally:
                await client.aclose()

        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
