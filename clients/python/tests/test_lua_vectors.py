"""The Lua fallback script (clients/lua/rl.lua) against clients/vectors/bucket.json, run by a
stand-in Lua interpreter (lua5.1, the language Redis embeds) whose TIME the test controls, so
every reply can be compared exactly. Skipped where no lua5.1 is installed (make deps-clients
installs it)."""

import json
import os
import shutil
import subprocess
import unittest

from redis_rl._core import Limit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
LUA = shutil.which("lua5.1") or shutil.which("lua")


@unittest.skipIf(LUA is None, "no lua5.1 interpreter (apt-get install lua5.1)")
class LuaVectors(unittest.TestCase):
    def test_script_replies_as_the_vectors_say(self):
        with open(os.path.join(ROOT, "vectors", "bucket.json")) as f:
            cases = json.load(f)["cases"]
        lines, expected, names = [], [], []
        for n, case in enumerate(cases):
            limit = Limit(float(case["rate"]), float(case["capacity"]))
            for i, step in enumerate(case["steps"]):
                args = limit.script_args(float(step["cost"]), refund=step["op"] == "refund")
                lines.append(" ".join([str(step["now_us"]), f"case{n}", step["op"], *args]))
                expected.append(step["expect"])
                names.append(f"{case['name']}, step {i}: {step}")
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"),
                              os.path.join(ROOT, "lua", "rl.lua")],
                             input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        replies = out.stdout.splitlines()
        self.assertEqual(len(replies), len(expected), out.stderr)
        for reply, want, name in zip(replies, expected, names):
            self.assertEqual([int(x) for x in reply.split()], want, name)

    def test_a_burst_then_a_denial_at_one_instant(self):
        limit = Limit(1, 2)
        calls = [f"1000000 k acquire {' '.join(limit.script_args(1))}"] * 3
        out = subprocess.run([LUA, os.path.join(ROOT, "lua", "harness.lua"),
                              os.path.join(ROOT, "lua", "rl.lua")],
                             input="\n".join(calls) + "\n", capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout.splitlines(), ["1 1 0 1000", "1 0 0 2000", "0 0 1000 2000"])


if __name__ == "__main__":
    unittest.main()
