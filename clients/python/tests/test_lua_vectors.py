"""The Lua fallback script (clients/lua/rl.lua) and the Functions library made from it
(clients/lua/rl_functions.lua) against clients/vectors/bucket.json, each run by a
stand-in Lua interpreter (lua5.1, the language Redis embeds) whose TIME the test controls, so
every reply can be compared exactly. Skipped where no lua5.1 is installed (make deps-clients
installs it)."""

import json
import os
import shutil
import subprocess
import unittest

import random

from redis_rl import bucket
from redis_rl._core import MAX_DEBT_NS, Limit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
LUA = shutil.which("lua5.1") or shutil.which("lua")


def limit_of(case):
    """The library's Limit for a vector case: a decimal rate, or N/S as `per`."""
    count, slash, per = case["rate"].partition("/")
    if slash:
        return Limit(float(count), float(case["capacity"]), per=float(per))
    return Limit(float(count), float(case["capacity"]))


@unittest.skipIf(LUA is None, "no lua5.1 interpreter (apt-get install lua5.1)")
class LuaVectors(unittest.TestCase):
    FILE = os.path.join(ROOT, "lua", "rl.lua")
    #: Whether the numbers go packed (one argument of 80 bytes per key, as the libraries send
    #: them) or as ten texts (the older form, still read).
    PACKED = False

    def numbers(self, limit, cost, refund=False):
        """A key's numbers as harness words: hex:<the 80 bytes>, or the ten texts."""
        if self.PACKED:
            return ["hex:" + limit.script_packed(cost, refund).hex()]
        return limit.script_args(cost, refund)

    def test_script_replies_as_the_vectors_say(self):
        with open(os.path.join(ROOT, "vectors", "bucket.json")) as f:
            cases = json.load(f)["cases"]
        lines, expected, names = [], [], []
        for n, case in enumerate(cases):
            limit = limit_of(case)
            for i, step in enumerate(case["steps"]):
                args = self.numbers(limit, float(step["cost"]), refund=step["op"] == "refund")
                lines.append(" ".join([str(step["now_us"]), f"case{n}", step["op"], *args]))
                expected.append(step["expect"])
                names.append(f"{case['name']}, step {i}: {step}")
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"),
                              self.FILE],
                             input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        replies = out.stdout.splitlines()
        self.assertEqual(len(replies), len(expected), out.stderr)
        for reply, want, name in zip(replies, expected, names):
            self.assertEqual([int(x) for x in reply.split()], want, name)

    def test_a_burst_then_a_denial_at_one_instant(self):
        limit = Limit(1, 2)
        calls = [f"1000000 k acquire {' '.join(self.numbers(limit, 1))}"] * 3
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"),
                              self.FILE],
                             input="\n".join(calls) + "\n", capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.splitlines(), ["1 1 0 1000", "1 0 0 2000", "0 0 1000 2000"])


    def test_random_sequences_agree_with_the_exact_bucket(self):
        # Differential: seeded random calls (acquire, peek, refund, charge into debt, multi over
        # 1-3 keys, some named twice) at exactly representable rates with integer capacities and costs, where
        # the script claims exactness. The reference is the exact in-process bucket.
        rng = random.Random(11)
        rates = [1, 2, 3, 7, 10, 1000, 999_999_937, 0.5, 2.5, 0.125]
        lines, expected = [], []
        for case in range(40):
            keys = [f"c{case}k{i}" for i in range(3)]
            limits = {}
            for key in keys:
                rate = rng.choice(rates)
                limits[key] = Limit(rate, rng.choice([1, 2, 3, 5, 10, 100]))
            local = bucket.LocalBuckets(instances=1)
            now_us = 1_700_000_000_000_000 + rng.randrange(10**6)
            for _ in range(30):
                now_us += rng.choice([0, 0, 0, 1, 999, 1000, 333_333, 10**6])
                op = rng.choice(["acquire", "acquire", "peek", "refund", "charge", "multi"])
                if op == "multi":
                    chosen = [rng.choice(keys) for _ in range(rng.randint(1, 3))]
                    costs = [rng.randint(0, 4) for _ in chosen]
                    items = [(k, limits[k], c) for k, c in zip(chosen, costs)]
                    allowed, refused, retry, replies = local.acquire_all(items, now_us)
                    want = [allowed, refused, retry] + [x for r in replies for x in r]
                    args = [a for k, _, c in items for a in self.numbers(limits[k], c)]
                    lines.append(" ".join([str(now_us), ",".join(chosen), "multi", *args]))
                else:
                    key, cost = rng.choice(keys), rng.randint(0, 6)
                    if op == "refund":
                        want = list(local.refund(key, limits[key], cost, now_us))
                    elif op == "charge":
                        want = list(local.charge(key, limits[key], cost, now_us, MAX_DEBT_NS))
                    else:
                        want = list(local.acquire(key, limits[key], cost, now_us, take=op == "acquire"))
                    lines.append(" ".join([str(now_us), key, op, *self.numbers(limits[key], cost, op == "refund")]))
                expected.append(want)
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"), self.FILE],
                             input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        replies = out.stdout.splitlines()
        self.assertEqual(len(replies), len(expected), out.stderr)
        for line, reply, want in zip(lines, replies, expected):
            self.assertEqual([int(x) for x in reply.split()], want, line[:120])


class FunctionsVectors(LuaVectors):
    """The same calls through the library's functions (rl_acquire, …), as FCALL sends them."""

    FILE = os.path.join(ROOT, "lua", "rl_functions.lua")


class PackedLuaVectors(LuaVectors):
    """The script with the numbers packed, as the libraries send them."""

    PACKED = True


class PackedFunctionsVectors(FunctionsVectors):
    """The library with the numbers packed, as the libraries send them."""

    PACKED = True


if __name__ == "__main__":
    unittest.main()
