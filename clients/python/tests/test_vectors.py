"""The in-process bucket (the `local` policy) against clients/vectors/bucket.json, the
vectors the module's bucket is held to. No server needed."""

import json
import os
import unittest

from redis_rl import _decimal, bucket
from redis_rl._core import MAX_DEBT_NS, Limit

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "vectors", "bucket.json")


class Vectors(unittest.TestCase):
    def test_every_step_of_every_case_matches(self):
        with open(VECTORS) as f:
            doc = json.load(f)
        self.assertEqual(doc["format"], 1)
        steps = 0
        for case in doc["cases"]:
            # Exact decimals and N/S, as the module parses them.
            rate, capacity = _decimal.parse_rate(case["rate"]), _decimal.parse(case["capacity"])
            full_at = None
            for i, step in enumerate(case["steps"]):
                cost = _decimal.parse(step["cost"])
                if step["op"] == "refund":
                    got, full_at = bucket.refund(rate, capacity, full_at, step["now_us"], cost)
                elif step["op"] == "charge":
                    got, full_at = bucket.charge(rate, capacity, full_at, step["now_us"], cost, MAX_DEBT_NS)
                else:
                    got, full_at = bucket.acquire(rate, capacity, full_at, step["now_us"], cost,
                                                  take=step["op"] == "acquire")
                self.assertEqual(list(got), step["expect"], f"{case['name']}, step {i}: {step}")
                steps += 1
        self.assertGreater(steps, 100)

    def test_local_buckets_share_a_limit_between_instances(self):
        # 4 instances of a 10/s, capacity 8 limit: each holds 2 tokens refilled at 2.5/s.
        local = bucket.LocalBuckets(instances=4)
        limit = Limit(10, 8)
        now_us = 1_000_000
        self.assertEqual(local.acquire("k", limit, 1, now_us), (1, 1, 0, 400))
        self.assertEqual(local.acquire("k", limit, 1, now_us), (1, 0, 0, 800))
        self.assertEqual(local.acquire("k", limit, 1, now_us), (0, 0, 400, 800))
        self.assertEqual(local.acquire("k", limit, 1, now_us + 400_000)[0], 1)

    def test_local_buckets_are_bounded(self):
        local = bucket.LocalBuckets(instances=1, max_keys=3)
        limit = Limit(1, 1)
        for i in range(10):
            local.acquire(f"k{i}", limit, 1, 0)
        self.assertEqual(len(local), 3)
        # The most recent keys are kept, still empty.
        self.assertEqual(local.acquire("k9", limit, 1, 0)[0], 0)

    def test_local_acquire_all_takes_nothing_when_one_refuses(self):
        local = bucket.LocalBuckets(instances=1)
        a, b = Limit(1, 5), Limit(1, 1)
        self.assertEqual(local.acquire_all([("a", a, 1), ("b", b, 1)], 0)[:3], (1, -1, 0))
        allowed, refused, retry, replies = local.acquire_all([("a", a, 1), ("b", b, 1)], 0)
        self.assertEqual((allowed, refused, retry), (0, 1, 1000))
        self.assertEqual(replies[0][:2], (1, 3))  # what a alone would answer
        self.assertEqual(local.acquire("a", a, 0, 0)[1], 4)  # but nothing was taken


class Packaging(unittest.TestCase):
    def test_package_ships_the_shared_lua_script(self):
        from importlib import resources

        shared = os.path.join(os.path.dirname(__file__), "..", "..", "lua", "rl.lua")
        with open(shared) as f:
            self.assertEqual(resources.files("redis_rl").joinpath("rl.lua").read_text(), f.read())


if __name__ == "__main__":
    unittest.main()
