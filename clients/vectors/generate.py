#!/usr/bin/env python3
"""Writes clients/vectors/bucket.json: test vectors for every implementation of the bucket.

The vectors come from the slow, obviously right model below: exact rationals (fractions) and
the formulas of docs/precision.md, nothing else. Each library's in-process bucket (Python,
Node, Rust) and the Lua fallback must reproduce every step of every case; the module's own
bucket is checked against the same file (crates/rl-bucket/tests/vectors.rs).

Run from the repository root:  python3 clients/vectors/generate.py  (rewrites the file; the
output is deterministic, so `git diff` shows any change in the model.)

Format (version 1): {"format": 1, "cases": [case, ...]}, each case

    {"name": str, "rate": str, "capacity": str, "steps": [step, ...]}

where capacity is a decimal string and rate a decimal string or `N/S` (N tokens per S
seconds, both decimal strings), each meaning its exact value, as the module parses its
arguments (an optional `+`, digits with at most one point, an optional exponent `e`/`E` with
an optional sign: "0.1" is one tenth, not the double nearest it). Every step is

    {"op": "acquire" | "peek" | "refund" | "charge", "now_us": int, "cost": str,
     "expect": [int, ...]}

starting from a missing key (a full bucket). `expect` is the module's reply: for acquire and
peek [allowed, remaining, retry_after_ms, reset_after_ms], for refund [remaining,
reset_after_ms], for charge [1, balance, retry_after_ms, reset_after_ms]. A charge (RL.CHARGE)
always applies, perhaps taking the bucket below zero (debt): its balance is the whole tokens
left rounded toward -infinity, negative in debt, and its retry_after_ms the wait until the debt
is repaid. A peek's remaining is that signed balance too (RL.PEEK shows a debt); an acquire's
is never below 0, and while in debt every acquire is denied, cost 0 included. Every charge
here is within the module's bound (full again within 100 years), so none is refused. The state carries over from step to step; now_us never goes backwards except
where a case says so in its name (a clock stepping back).
"""

import json
import os
import re
import sys
from fractions import Fraction
from math import ceil, floor

NS_PER_S = 10**9

# The module's decimal grammar (rl_bucket::Decimal::parse).
DECIMAL = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def decimal(text):
    """The exact value of a decimal string."""
    if not DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal: {text!r}")
    return Fraction(text)


def rate_of(text):
    """The exact tokens per second of a rate string: a decimal, or N/S."""
    count, slash, period = text.partition("/")
    return decimal(count) / decimal(period) if slash else decimal(count)


def ceil_ms(ns):
    return ceil(ns / Fraction(10**6))


class Model:
    """One bucket, as docs/precision.md defines it. full_at is an exact rational ns instant."""

    def __init__(self, rate, capacity):
        self.rate = rate_of(rate)
        self.capacity = decimal(capacity)
        self.t_ns = NS_PER_S / self.rate  # ns per token, exact
        self.full_at = None  # a missing key: full

    def debt(self, now_ns):
        return max(Fraction(0), (self.full_at or 0) - now_ns)

    def tokens(self, debt):
        return self.capacity - debt * self.rate / NS_PER_S

    def reply(self, allowed, debt, retry_after_ms, signed=False):
        balance = floor(self.tokens(debt))
        remaining = balance if signed else max(0, balance)
        return [int(allowed), remaining, retry_after_ms, ceil_ms(debt)]

    def acquire(self, now_us, cost, take=True):
        now_ns = now_us * 1000
        cost = decimal(cost)
        debt = self.debt(now_ns)
        # A peek reports the signed balance; a take what may be taken, never below 0.
        signed = not take
        if cost > self.capacity:
            return self.reply(False, debt, -1, signed)
        slack = (self.capacity - cost) * self.t_ns
        if debt > slack:
            return self.reply(False, debt, ceil_ms(debt - slack), signed)
        if cost > 0 and take:
            self.full_at = max(self.full_at or 0, now_ns) + cost * self.t_ns
            debt = self.debt(now_ns)
        return self.reply(True, debt, 0, signed)

    def charge(self, now_us, cost):
        now_ns = now_us * 1000
        cost = decimal(cost)
        if cost > 0:
            self.full_at = max(self.full_at or 0, now_ns) + cost * self.t_ns
        debt = self.debt(now_ns)
        if debt > MAX_DEBT_NS:
            raise ValueError("a vector charge past the module's bound: the module refuses it")
        owed = debt - self.capacity * self.t_ns  # ns of refill until the balance is 0 again
        return [1, floor(self.tokens(debt)), ceil_ms(owed) if owed > 0 else 0, ceil_ms(debt)]

    def refund(self, now_us, cost):
        now_ns = now_us * 1000
        debt = self.debt(now_ns)
        # At most the capacity comes back (RL.REFUND caps it): a charge can owe more.
        debt = max(Fraction(0), debt - min(decimal(cost), self.capacity) * self.t_ns)
        self.full_at = None if debt == 0 else now_ns + debt
        remaining = max(0, floor(self.tokens(debt)))
        return [remaining, ceil_ms(debt)]

    def step(self, op, now_us, cost):
        if op == "acquire":
            return self.acquire(now_us, cost)
        if op == "peek":
            return self.acquire(now_us, cost, take=False)
        if op == "charge":
            return self.charge(now_us, cost)
        return self.refund(now_us, cost)


# The longest a charge may leave a bucket short of full: 100 years (MAX_REFILL_S), in ns.
MAX_DEBT_NS = 3_153_600_000 * NS_PER_S

T0 = 1_700_000_000_000_000  # a plausible Unix-epoch µs, so sums are of realistic size


def burst(count, cost="1"):
    return [("acquire", 0, cost)] * count


def case(name, rate, capacity, steps):
    model = Model(rate, capacity)
    out = []
    for op, dt_us, cost in steps:
        now_us = T0 + dt_us
        out.append({"op": op, "now_us": now_us, "cost": cost, "expect": model.step(op, now_us, cost)})
    return {"name": name, "rate": rate, "capacity": capacity, "steps": out}


def spaced(op, cost, start_us, every_us, count):
    return [(op, start_us + i * every_us, cost) for i in range(count)]


def cases():
    yield case("burst of capacity then denied, 5/s cap 10", "5", "10",
               burst(11) + [("peek", 0, "1"), ("acquire", 199_999, "1"), ("acquire", 200_000, "1")])
    yield case("cost above capacity is impossible (-1)", "1", "3",
               [("acquire", 0, "4"), ("acquire", 0, "3"), ("acquire", 0, "4"), ("peek", 0, "4")])
    yield case("cost 0 reads and writes nothing", "1", "3",
               [("acquire", 0, "0"), ("acquire", 0, "2"), ("acquire", 0, "0"), ("acquire", 500_000, "0")])
    yield case("3/s: 1e9/rate is not a whole ns", "3", "3",
               burst(4) + spaced("acquire", "1", 333_333, 1, 3) + spaced("acquire", "1", 666_666, 1, 3)
               + spaced("acquire", "1", 1_000_000, 1, 3))
    yield case("0.1/s is not a dyadic rate", "0.1", "2",
               burst(3) + [("acquire", 9_999_999, "1"), ("acquire", 10_000_000, "1"), ("acquire", 10_000_001, "1")])
    yield case("1/60 per second (one a minute)", "0.016666666666666666", "5",
               burst(6) + [("acquire", 59_999_999, "1"), ("acquire", 60_000_000, "1"), ("peek", 60_000_000, "1")])
    yield case("7 per second, a million-µs walk", "7", "2",
               spaced("acquire", "1", 0, 142_857, 30))
    yield case("fractional costs", "2", "2.5",
               [("acquire", 0, "0.5"), ("acquire", 0, "1.5"), ("acquire", 0, "0.6"), ("acquire", 0, "0.5"),
                ("acquire", 249_999, "0.5"), ("acquire", 250_000, "0.5")])
    yield case("fractional capacity, remaining rounds down", "1", "1.5",
               [("peek", 0, "1"), ("acquire", 0, "1"), ("peek", 0, "1"), ("acquire", 499_999, "1"),
                ("acquire", 500_000, "1")])
    yield case("refund gives back and deletes when full", "1", "5",
               [("acquire", 0, "3"), ("refund", 0, "1"), ("acquire", 0, "3"), ("refund", 10, "10"),
                ("peek", 10, "5"), ("refund", 20, "1")])
    yield case("refund on a missing key changes nothing", "2", "4",
               [("refund", 0, "1"), ("peek", 0, "4")])
    yield case("costs that sum exactly to capacity at 3/s", "3", "1",
               [("acquire", 0, "0.25"), ("acquire", 0, "0.25"), ("acquire", 0, "0.5"), ("acquire", 0, "0.000001"),
                ("peek", 333_333, "1"), ("peek", 333_334, "1")])
    yield case("clock steps back: never adds tokens", "1", "2",
               [("acquire", 5_000_000, "2"), ("acquire", 4_000_000, "1"), ("peek", 4_000_000, "1"),
                ("acquire", 6_000_000, "1")])
    yield case("slowest rate, one token per 11.6 days", "0.000001", "1",
               [("acquire", 0, "1"), ("acquire", 999_999_999_999, "1"), ("acquire", 1_000_000_000_000, "1")])
    yield case("fastest rate, one token per ns", "1000000000", "1000",
               burst(2, "1000") + [("acquire", 1, "1000"), ("acquire", 1, "999"), ("peek", 2, "1000")])
    yield case("largest capacity", "1000000", "1000000000000000",
               [("acquire", 0, "999999999999999"), ("acquire", 0, "2"), ("acquire", 1, "1"), ("peek", 0, "0")])
    yield case("a full refill of 100 years", "0.001", "3153600",
               [("acquire", 0, "3153600"), ("acquire", 1_000_000_000, "1"), ("acquire", 1_000_000_000, "1")])
    yield case("2.5e3 per second, many calls in one instant", "2.5e3", "10",
               burst(12) + spaced("acquire", "1", 400, 400, 5))
    yield case("rate 0.3 with cost 3 against capacity 3", "0.3", "3",
               [("acquire", 0, "3"), ("peek", 9_999_999, "3"), ("acquire", 10_000_000, "3"),
                ("acquire", 10_000_001, "1")])
    # Decimals mean what they say. The double nearest 0.7 is below it, so it would refill 7
    # tokens in a hair over 10 s (reset 10001 ms); the decimal takes exactly 10 s.
    yield case("0.7 is seven tenths, not the double below it", "0.7", "7",
               [("acquire", 0, "7"), ("peek", 9_999_999, "7"), ("acquire", 10_000_000, "7"),
                ("acquire", 10_000_000, "0.7")])
    yield case("0.01 is one token per 100 s", "0.01", "2",
               burst(3) + [("acquire", 99_999_999, "1"), ("acquire", 100_000_000, "1"),
                           ("peek", 200_000_000, "2")])
    yield case("1e-6 in e notation is the slowest rate", "1e-6", "2",
               [("acquire", 0, "1.5"), ("peek", 0, "1"), ("acquire", 500_000_000_000, "1"),
                ("peek", 1_000_000_000_000, "1")])
    yield case("decimal capacity and costs, 0.1 a take", "3", "0.3",
               [("acquire", 0, "0.1"), ("acquire", 0, "0.1"), ("acquire", 0, "0.1"), ("acquire", 0, "1e-1"),
                ("acquire", 33_333, "0.1"), ("acquire", 33_334, "0.1"), ("refund", 33_334, "0.2"),
                ("peek", 33_334, "0.3")])
    yield case("E notation with a sign: 2.5E+3 per second, capacity 1E1", "2.5E+3", "1E1",
               burst(11) + [("acquire", 400, "1"), ("acquire", 799, "1")])
    # N/S: N tokens per S seconds, exactly, where N/S has no decimal.
    yield case("100/60: a hundred a minute", "100/60", "100",
               burst(101) + [("acquire", 599_999, "1"), ("acquire", 600_000, "1"),
                             ("peek", 60_000_000, "100")])
    yield case("5/1 is 5 per second", "5/1", "10",
               burst(11) + [("acquire", 199_999, "1"), ("acquire", 200_000, "1")])
    yield case("3/10: 1e9/rate is not a whole ns", "3/10", "3",
               burst(4) + spaced("acquire", "1", 3_333_333, 1, 3) + spaced("acquire", "1", 6_666_666, 1, 3))
    yield case("7/3 with decimal costs", "7/3", "2",
               [("acquire", 0, "1.5"), ("acquire", 0, "0.5"), ("acquire", 0, "0.1"),
                ("acquire", 42_857, "0.1"), ("acquire", 42_858, "0.1"), ("refund", 42_858, "1"),
                ("peek", 42_858, "1.5")])
    yield case("1/86400: one a day", "1/86400", "1",
               [("acquire", 0, "1"), ("acquire", 86_399_999_999, "1"), ("acquire", 86_400_000_000, "1"),
                ("refund", 86_400_000_000, "0.5"), ("peek", 86_400_000_000, "1")])
    yield case("decimal N and S: 2.5/0.5 is 5 per second", "2.5/0.5", "1e1",
               burst(11) + [("acquire", 200_000, "1")])


def debt_cases():
    """Charges into debt, then takes, peeks and cost-0 checks at various times, at rates
    whose token interval is not a whole ns (3/s, 7/s, 3/10) or not a whole ms (100/60 is 0.6 s:
    whole)."""
    # 3/s, capacity 3: a charge of 5 leaves 2 in debt, repaid 666.67 ms later.
    yield case("charge into debt at 3/s, then takes and checks", "3", "3",
               [("charge", 0, "5"), ("peek", 0, "0"), ("acquire", 0, "0"), ("acquire", 0, "1"),
                ("peek", 333_333, "0"), ("peek", 333_334, "0"), ("acquire", 666_666, "0"),
                ("acquire", 666_667, "0"), ("acquire", 666_667, "1"), ("acquire", 1_000_000, "1"),
                ("peek", 1_000_000, "1")])
    yield case("charge into debt at 7/s, a second charge adds to the debt", "7", "7",
               [("charge", 0, "10"), ("charge", 0, "4"), ("peek", 0, "0"), ("acquire", 500_000, "0"),
                ("peek", 999_999, "0"), ("acquire", 1_000_000, "0"), ("peek", 1_000_000, "1"),
                ("acquire", 1_142_857, "1"), ("acquire", 1_142_858, "1"), ("charge", 1_142_858, "0")])
    yield case("charge into debt at 3/10: one token per 3.33 s", "3/10", "3",
               [("acquire", 0, "2"), ("charge", 0, "3"), ("peek", 0, "1"), ("acquire", 3_333_333, "0"),
                ("acquire", 3_333_334, "0"), ("peek", 3_333_334, "0"), ("acquire", 6_666_667, "1"),
                ("peek", 16_666_667, "3")])
    yield case("charge into debt at 100/60: a hundred a minute", "100/60", "100",
               [("charge", 0, "250"), ("peek", 0, "0"), ("acquire", 59_999_999, "0"),
                ("peek", 89_999_999, "0"), ("acquire", 90_000_000, "0"), ("acquire", 90_000_000, "1"),
                ("acquire", 90_600_000, "1"), ("charge", 100_000_000, "100"), ("peek", 150_000_000, "0")])
    yield case("charges within the capacity are takes; cost 0 changes nothing", "3", "3",
               [("charge", 0, "0"), ("charge", 0, "1"), ("peek", 0, "2"), ("charge", 0, "2"),
                ("acquire", 0, "0"), ("charge", 0, "0.5"), ("peek", 0, "0"), ("acquire", 166_666, "0"),
                ("acquire", 166_667, "0")])
    yield case("a refund in debt, and an acquire's remaining never below 0", "7", "2",
               [("charge", 0, "9"), ("acquire", 0, "1"), ("refund", 0, "2"), ("peek", 0, "1"),
                ("refund", 0, "3"), ("peek", 0, "0"), ("acquire", 428_572, "0")])
    yield case("a charge of 100 years' refill, the most a charge may owe", "1", "1",
               [("charge", 0, "3153600000"), ("peek", 0, "0"), ("acquire", 1_000_000, "0"),
                ("charge", 1_000_000, "1"), ("peek", 1_000_000, "1")])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    doc = {"format": 1, "cases": list(cases()) + list(debt_cases())}
    outputs = {os.path.join(here, "bucket.json"): json.dumps(doc, indent=1) + "\n"}
    for path, text in outputs.items():
        if "--check" in sys.argv:
            with open(path) as f:
                if f.read() != text:
                    sys.exit(f"{path} is stale: run python3 clients/vectors/generate.py")
            continue
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}: {len(doc['cases'])} cases, {sum(len(c['steps']) for c in doc['cases'])} steps")


if __name__ == "__main__":
    main()
