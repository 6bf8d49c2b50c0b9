"""Limits as the module reads them: exact decimals, `per` periods sent as N/S, and the ranges
and error texts of clients/vectors/ranges.json (shipped in the package; the module's answers
to the same boundary cases are checked by tests/ranges.rs). No server needed."""

import datetime
import json
import os
import unittest
from fractions import Fraction
from importlib import resources

from redis_rl import Limit, Limiter
from redis_rl import _decimal
from redis_rl._core import RANGES

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "vectors", "ranges.json")


def limit_of(case):
    """The case's limit as a caller writes it: a number, or N/S as `per`."""
    count, slash, per = case["rate"].partition("/")
    if slash:
        return Limit(float(count), float(case["capacity"]), per=float(per))
    return Limit(float(count), float(case["capacity"]))


class Unreachable:
    """A client that must never be reached: validation comes first."""

    def execute_command(self, *args, **options):
        raise AssertionError(f"Redis was called: {args}")

    script_load = execute_command


class Ranges(unittest.TestCase):
    def setUp(self):
        with open(SHARED) as f:
            self.shared = json.load(f)

    def test_the_package_ships_the_shared_ranges(self):
        with open(SHARED) as f:
            self.assertEqual(resources.files("redis_rl").joinpath("ranges.json").read_text(), f.read())
        for name in ("rate", "capacity", "refill", "cost"):
            self.assertEqual(RANGES[name], self.shared[name])

    def test_every_boundary_case_gets_the_shared_answer_before_any_io(self):
        limiter = Limiter(Unreachable(), on_error="closed")
        self.assertGreaterEqual(len(self.shared["cases"]), 20)
        for case in self.shared["cases"]:
            error = None
            try:
                limit = limit_of(case)
            except ValueError as e:
                error = str(e)
            else:
                if case["error"] == "cost":
                    with self.assertRaises(ValueError, msg=case["name"]) as raised:
                        limiter.peek("k", limit, float(case["cost"]))
                    error = str(raised.exception)
            want = None if case["error"] is None else self.shared[case["error"]]["error"]
            self.assertEqual(error, want, case["name"])


class Decimals(unittest.TestCase):
    def test_a_numeric_cost_of_any_type_is_a_number(self):
        from redis_rl._core import check_cost

        self.assertEqual(check_cost("2"), 2.0)
        self.assertEqual(check_cost(2), 2)
        self.assertEqual(check_cost(0.1), 0.1)
        for bad in ("x", None, True, float("nan"), -1):
            with self.assertRaises(ValueError, msg=repr(bad)):
                check_cost(bad)

    def test_numbers_are_sent_as_their_shortest_decimal(self):
        self.assertEqual(Limit(0.1, 1).args(), ["0.1", "1"])
        self.assertEqual(Limit(5.0, 10.0).args(), ["5", "10"])
        self.assertEqual(Limit(1e-6, 1e-7).args(), ["1e-06", "1e-07"])  # e notation the module reads
        self.assertEqual(Limit(2.5e8, 1e15).args(), ["250000000", "1000000000000000"])

    def test_a_decimal_means_its_exact_value_not_the_doubles(self):
        self.assertEqual(Limit(0.1, 1).rate_fraction, Fraction(1, 10))
        self.assertEqual(Limit(0.3, 0.7).capacity_fraction, Fraction(7, 10))
        # The script gets T = 1e6 / 0.1 µs = 1e7 exactly, with denominator 1.
        self.assertEqual(Limit(0.1, 1).script_args(1)[:3], ["1", "10000000", "0"])

    def test_the_grammar_is_the_modules(self):
        for good, value in (("0.1", Fraction(1, 10)), ("1e-06", Fraction(1, 10**6)), (".5", Fraction(1, 2)),
                            ("5.", Fraction(5)), ("+2", Fraction(2)),
                            ("2.5E+3", Fraction(2500)), ("100/60", Fraction(5, 3)), ("2.5/0.5", Fraction(5))):
            self.assertEqual(_decimal.parse_rate(good), value, good)
        for bad in ("", ".", "1e", "-1", "0x10", "inf", " 1", "1/0", "1/2/3"):
            with self.assertRaises(ValueError, msg=bad):
                _decimal.parse_rate(bad)
        for number in (0.1, 1e-06, 1e16, 123.456, 1e-300, 2**60, 7):
            self.assertTrue(_decimal.DECIMAL.fullmatch(_decimal.text(number)), number)

    def test_a_period_is_sent_as_n_over_s_with_the_count_as_capacity(self):
        minute = Limit(100, per=60)
        self.assertEqual(minute.args(), ["100/60", "100"])
        self.assertEqual(minute.rate_fraction, Fraction(5, 3))
        self.assertEqual(minute.capacity, 100)
        self.assertEqual(Limit(100, 20, per=60).args(), ["100/60", "20"])
        self.assertEqual(Limit(3, per=datetime.timedelta(milliseconds=1500)).args(), ["3/1.5", "3"])
        self.assertEqual(repr(minute), "Limit(100, 100, per=60)")
        self.assertEqual(Limit(5, per=1), Limit(5, 5))
        self.assertNotEqual(minute, Limit(100 / 60, 100))  # the double is not five thirds
        with self.assertRaises(ValueError):
            Limit(1, per=0)
        with self.assertRaises(ValueError):
            Limit(1, per=10**7)  # 1e-7 per second
        with self.assertRaises(TypeError):
            Limit(1)

    def test_a_rate_written_n_over_s_is_that_period(self):
        # Before: "100/60", the module's own text, was refused ("rate must be a finite number").
        self.assertEqual(Limit("100/60").args(), ["100/60", "100"])
        self.assertEqual(Limit("100/60"), Limit(100, per=60))
        self.assertEqual(Limit("3/10", "7").args(), ["3/10", "7"])
        self.assertEqual(Limit("3/10", 7).rate_fraction, Fraction(3, 10))
        for bad in ("100/0", "100/x", "1/2/3", "1/", "1/-2"):
            with self.subTest(bad), self.assertRaisesRegex(ValueError, '"N/S" text with S a decimal above 0'):
                Limit(bad)
        with self.assertRaisesRegex(ValueError, "rate must be a finite number"):
            Limit("x/2")
        with self.assertRaisesRegex(ValueError, 'rate given as "N/S" text takes no per'):
            Limit("100/60", per=60)

    def test_the_local_bucket_refills_a_minute_limit_exactly(self):
        from redis_rl import bucket

        local = bucket.LocalBuckets(instances=1)
        limit = Limit(100, per=60)
        for _ in range(100):
            self.assertTrue(local.acquire("k", limit, 1, 0)[0])
        self.assertEqual(local.acquire("k", limit, 1, 599_999)[:3], (0, 0, 1))
        self.assertEqual(local.acquire("k", limit, 1, 600_000)[0], 1)
        # A tenth of a token is a tenth, not the double 0.1.
        self.assertEqual(local.acquire("t", Limit(1, 0.3), 0.1, 0)[1], 0)
        self.assertEqual(local.acquire("t", Limit(1, 0.3), 0.1, 0)[0], 1)
        self.assertEqual(local.acquire("t", Limit(1, 0.3), 0.1, 0)[0], 1)
        self.assertEqual(local.acquire("t", Limit(1, 0.3), 0.1, 0)[0], 0)


if __name__ == "__main__":
    unittest.main()
