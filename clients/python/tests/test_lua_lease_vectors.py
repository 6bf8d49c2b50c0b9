"""The Lua fallback's leases and reservations, script (clients/lua/rl.lua) and Functions
library (clients/lua/rl_functions.lua), against clients/vectors/lease.json and reserve.json,
run by a stand-in Lua interpreter (lua5.1) whose TIME the test controls (clients/lua/harness.lua),
so every reply is compared exactly with what the module answers. Skipped where no lua5.1 is
installed (make deps-clients installs it)."""

import json
import os
import shutil
import subprocess
import unittest

from redis_rl._core import Limit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
LUA = shutil.which("lua5.1") or shutil.which("lua")


def limit_of(case):
    count, slash, per = case["rate"].partition("/")
    if slash:
        return Limit(float(count), float(case["capacity"]), per=float(per))
    return Limit(float(count), float(case["capacity"]))


def lease_line(key, step):
    op = step["op"]
    args = {"lease": ["limit", "ttl_ms", "id"], "release": ["id"], "renew": ["id", "ttl_ms"],
            "leases": ["limit"]}[op]
    return " ".join([str(step["now_us"]), key, op, *(str(step[a]) for a in args)])


def reserve_line(key, limit, step, packed=False):
    """The harness line of a reservation vector's step: the numbers as ten texts, or packed
    (hex:<the 80 bytes>, one argument, as the libraries send them)."""
    def numbers(cost, refund=False):
        if packed:
            return ["hex:" + limit.script_packed(cost, refund).hex()]
        return limit.script_args(cost, refund)

    op = step["op"]
    if op == "reserve":
        args = numbers(step["estimate"]) + [str(step["ttl_ms"]), step["id"]]
    elif op == "settle":
        # A settle's numbers are a charge's for the actual (rounded up): rl.lua's header.
        args = numbers(step["actual"]) + [step["id"]]
    else:
        args = numbers(step["cost"], refund=op == "refund")
    return " ".join([str(step["now_us"]), key, op, *args])


@unittest.skipIf(LUA is None, "no lua5.1 interpreter (apt-get install lua5.1)")
class LuaLeaseVectors(unittest.TestCase):
    FILE = os.path.join(ROOT, "lua", "rl.lua")

    def run_lines(self, lines):
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"), self.FILE, "json"],
                             input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True)
        replies = out.stdout.splitlines()
        self.assertEqual(len(replies), len(lines), out.stderr)
        return [json.loads(r) for r in replies]

    def check(self, name, make_line):
        with open(os.path.join(ROOT, "vectors", name)) as f:
            cases = json.load(f)["cases"]
        lines, expected, names = [], [], []
        for n, case in enumerate(cases):
            for i, step in enumerate(case["steps"]):
                lines.append(make_line(case, f"case{n}", step))
                expected.append(step["expect"])
                names.append(f"{case['name']}, step {i}: {step}")
        self.assertGreaterEqual(len(lines), 40)
        for got, want, label in zip(self.run_lines(lines), expected, names):
            self.assertEqual(got, want, label)

    def test_leases_reply_as_the_vectors_say(self):
        self.check("lease.json", lambda case, key, step: lease_line(key, step))

    def test_reservations_reply_as_the_vectors_say(self):
        self.check("reserve.json", lambda case, key, step: reserve_line(key, limit_of(case), step))

    def test_reservations_with_packed_numbers_reply_as_the_vectors_say(self):
        self.check("reserve.json",
                   lambda case, key, step: reserve_line(key, limit_of(case), step, packed=True))

    def test_bad_arguments_get_the_modules_errors_and_write_nothing(self):
        one = Limit(1, 10)
        calls = [
            ("L lease 0 10 a", "ERR limit must be an integer from 1 to 10000 (leases)"),
            ("L lease 10001 10 a", "ERR limit must be an integer from 1 to 10000 (leases)"),
            ("L lease 1.5 10 a", "ERR limit must be an integer from 1 to 10000 (leases)"),
            ("L lease 1 0 a", "ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)"),
            ("L lease 1 3153600000001 a", "ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)"),
            ("L lease 1 10 0123456789abcdefX", "ERR id must be 1 to 16 bytes"),
            ("L renew a -1", "ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)"),
            ("L leases 0", "ERR limit must be an integer from 1 to 10000 (leases)"),
            (f"B reserve {' '.join(one.script_args(0))} 10 a", "ERR estimate must be a number above 0 (tokens)"),
            (f"B reserve {' '.join(one.script_args(1))} 0 a", "ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)"),
            (f"B settle {' '.join(one.script_args(1))} a\\b", "ERR id a\\x5cb is not an open reservation of this key (settled, expired or never made)"),
            (f"L settle {' '.join(one.script_args(1))} a", None),
        ]
        lines = [f"1700000000000000 {c}" for c, _ in calls]
        lines.append("1700000000000000 L lease 1 10 a")  # taken: nothing was written before
        lines.append(f"1700000000000000 L reserve {' '.join(one.script_args(1))} 10 r")
        replies = self.run_lines(lines)
        for (call, want), got in zip(calls, replies):
            if want is not None:
                self.assertEqual(got, {"error": want}, call)
        self.assertEqual(replies[-2], [1, "a", 1, 10])
        self.assertEqual(replies[-1], {"error": "WRONGTYPE Operation against a key holding the wrong kind of value"})


class FunctionsLeaseVectors(LuaLeaseVectors):
    """The same calls through the library's functions (rl_lease, …), as FCALL sends them."""

    FILE = os.path.join(ROOT, "lua", "rl_functions.lua")


if __name__ == "__main__":
    unittest.main()
