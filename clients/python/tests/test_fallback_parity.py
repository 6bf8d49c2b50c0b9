"""The fallback script (clients/lua/rl.lua, by EVALSHA) and the Functions library made from it
(clients/lua/rl_functions.lua, by FCALL) against the module, on one real server: the same
seeded sequence of calls (acquire, peek, refund, charge into debt, multi, costs above the
capacity; the script's acquires in both forms, the mode with texts and the short form of packed
numbers without it, whose packed reply is read as the libraries read it) sent to each of the three back to back, on keys of their own, must get the same
replies. The limits refill one token in 1,000 s or more, so no token comes back between the
three calls; their waits may differ only by the milliseconds the calls took."""

import os
import random
import time
import unittest

import redis

from redis_rl import Limit
from redis_rl._core import short_reply
from servers import Server

LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lua")
MODULE_COMMAND = {"acquire": "RL.ACQUIRE", "peek": "RL.PEEK", "refund": "RL.REFUND",
                  "charge": "RL.CHARGE"}
# Whole-microsecond token intervals and fractional ones (D = 3, 7, 9), decimal and N/S rates.
LIMITS = [Limit(0.001, 5), Limit(3, per=10_000), Limit(7, 10, per=100_000), Limit(1, 2, per=1000),
          Limit(0.0003, 3), Limit(9, 4, per=90_000)]


class FallbackParity(unittest.TestCase):
    def setUp(self):
        server = Server(module=True)
        self.addCleanup(server.close)
        self.client = redis.Redis(port=server.port)
        self.addCleanup(self.client.close)
        with open(os.path.join(LUA, "rl.lua")) as f:
            self.sha = self.client.script_load(f.read())
        with open(os.path.join(LUA, "rl_functions.lua")) as f:
            self.client.function_load(f.read(), replace=True)

    def three(self, op, items, short=False):
        """The call on the module (keys m:*), the script (s:*) and the functions (f:*). With
        `short`, an acquire is what the libraries send: the script's short form (the key's
        packed numbers and no mode) and the library's rl_acquire_packed, each answered
        packed."""
        if op == "multi":
            module = ["RL.ACQUIRE.MULTI"]
            for n, limit, cost in items:
                module += [f"m:{n}", *limit.args(), str(cost)]
        else:
            (n, limit, cost), = items
            module = [MODULE_COMMAND[op], f"m:{n}", *limit.args(), str(cost)]
        numbers = [x for _, limit, cost in items
                   for x in limit.script_args(cost, refund=op == "refund")]
        script = [len(items), *[f"s:{n}" for n, _, _ in items], op, *numbers]
        read = lambda reply: reply  # noqa: E731
        function = [f"rl_{op}", len(items), *[f"f:{n}" for n, _, _ in items], *numbers]
        if short and op == "acquire":
            (n, limit, cost), = items
            script = [1, f"s:{n}", limit.script_packed(cost)]
            function = ["rl_acquire_packed", 1, f"f:{n}", limit.script_packed(cost)]
            read = short_reply
        replies = []
        for call in (lambda: self.client.execute_command(*module),
                     lambda: read(self.client.evalsha(self.sha, *script)),
                     lambda: read(self.client.fcall(*function))):
            try:
                replies.append(call())
            except redis.ResponseError as e:
                replies.append(f"error: {e}")
        return replies

    def assert_alike(self, op, module, other, took_ms, what):
        if isinstance(module, str) or isinstance(other, str):
            self.assertEqual(module.split(" script:")[0], other.split(" script:")[0], what)
            return
        if op == "multi":
            self.assertEqual(module[:2], other[:2], what)
            self.assertEqual(module[2] < 0, other[2] < 0, what)
            self.assertLessEqual(abs(module[2] - other[2]), took_ms + 1, what)
            self.assertEqual(len(module[3]), len(other[3]), what)
            for a, b in zip(module[3], other[3]):
                self.assert_alike("acquire", a, b, took_ms, what)
            return
        if op == "refund":  # {remaining, reset_after_ms}
            self.assertEqual(module[0], other[0], what)
            self.assertLessEqual(abs(module[1] - other[1]), took_ms + 1, what)
            return
        self.assertEqual(module[:2], other[:2], what)  # allowed (or applied), remaining
        self.assertEqual(module[2] < 0, other[2] < 0, what)
        self.assertLessEqual(abs(module[2] - other[2]), took_ms + 1, what)
        self.assertLessEqual(abs(module[3] - other[3]), took_ms + 1, what)

    def test_script_and_functions_reply_as_the_module_does(self):
        rng = random.Random(7)
        took_ms = 0
        ops = ["acquire"] * 5 + ["peek", "peek", "refund", "charge", "multi"]
        for i in range(400):
            op = rng.choice(ops)
            size = rng.randint(1, 3) if op == "multi" else 1
            items = []
            for _ in range(size):
                n = rng.randrange(len(LIMITS))
                items.append((n, LIMITS[n], rng.choice([0, 1, 1, 1, 2, 3, 6])))
            started = time.monotonic()
            # Every other acquire is what the libraries send (packed, answered packed), the
            # rest the mode (or rl_acquire) and texts.
            module, script, function = self.three(op, items, short=i % 2 == 1)
            # A bucket's instant was set by whichever earlier call found it full, at each
            # path's own clock reading: waits differ by at most the longest three calls yet.
            took_ms = max(took_ms, int((time.monotonic() - started) * 1000) + 1)
            what = f"call {i}: {op} {items}: module {module}, script {script}, function {function}"
            self.assert_alike(op, module, script, took_ms, what)
            self.assert_alike(op, module, function, took_ms, what)
        # Each bucket ended where the module's did: the same keys hold state.
        for n in range(len(LIMITS)):
            self.assertEqual(self.client.exists(f"s:{n}"), self.client.exists(f"m:{n}"), n)
            self.assertEqual(self.client.exists(f"f:{n}"), self.client.exists(f"m:{n}"), n)

    def three_raw(self, module, mode, key, args):
        """A lease or reservation call on the module (key m:…), the script (s:…) and the
        functions (f:…): `module` is the module's command after its key, `args` the
        fallback's after it."""
        replies = []
        for call in (lambda: self.client.execute_command(module[0], f"m:{key}", *module[1:]),
                     lambda: self.client.evalsha(self.sha, 1, f"s:{key}", mode, *args),
                     lambda: self.client.fcall(f"rl_{mode}", 1, f"f:{key}", *args)):
            try:
                replies.append(call())
            except redis.ResponseError as e:
                replies.append(f"error: {e}")
        return replies

    def assert_same_shape(self, mode, module, other, took_ms, what):
        """Exact but for waits, which may differ by the milliseconds the calls took."""
        if isinstance(module, str) or isinstance(other, str) or not isinstance(module, list):
            if isinstance(module, str) and isinstance(other, str):
                module, other = module.split(" script:")[0], other.split(" script:")[0]
            self.assertEqual(module, other, what)
            return
        exact = {"lease": 3, "leases": 1, "reserve": 3, "settle": 1}[mode]
        self.assertEqual(module[:exact], other[:exact], what)
        for a, b in zip(module[exact:], other[exact:]):
            self.assertEqual(a < 0, b < 0, what)
            self.assertLessEqual(abs(a - b), took_ms + 1, what)

    def test_leases_and_reservations_reply_as_the_module_does(self):
        # Seeded random takes, releases, renewals and counts on three lease keys, and reserves,
        # settles (of open, settled and unknown ids), acquires and charges on slow buckets, sent
        # to the module, the script and the functions back to back. TTLs are long, except
        # leases of 1 ms followed by a 10 ms sleep, after which they are expired for all three.
        rng = random.Random(30)
        took_ms, ids = 0, ["a", "b", "c", "d", "worker-7", "0123456789abcdef"]
        held = {"m": 0, "s": 0, "f": 0}
        for i in range(400):
            op = rng.choice(["lease"] * 4 + ["release", "renew", "leases", "short",
                                             "reserve", "reserve", "settle", "settle", "acquire"])
            key, ident = f"L{rng.randrange(3)}", rng.choice(ids)
            limit = rng.randint(1, 4)
            ttl = rng.choice([100_000, 200_000, 3_153_600_000_000])
            started = time.monotonic()
            if op in ("lease", "short"):
                ttl = 1 if op == "short" else ttl
                mode, module, args = "lease", ["RL.LEASE", limit, ttl, "ID", ident], [limit, ttl, ident]
            elif op == "release":
                mode, module, args = "release", ["RL.RELEASE", ident], [ident]
            elif op == "renew":
                mode, module, args = "renew", ["RL.RENEW", ident, ttl], [ident, ttl]
            elif op == "leases":
                mode, module, args = "leases", ["RL.LEASES", limit], [limit]
            else:
                n = rng.randrange(len(LIMITS))
                key, lim, amount = f"B{n}", LIMITS[n], rng.choice([1, 1, 2, 3, 6])
                if op == "reserve":
                    mode = "reserve"
                    module = ["RL.RESERVE", *lim.args(), amount, ttl, "ID", ident]
                    args = [*lim.script_args(amount), ttl, ident]
                elif op == "settle":
                    mode = "settle"
                    module = ["RL.SETTLE", *lim.args(), ident, amount]
                    args = [*lim.script_args(amount), ident]
                else:
                    mode, module = "acquire", ["RL.ACQUIRE", *lim.args(), amount]
                    args = lim.script_args(amount)
            replies = self.three_raw(module, mode, key, args)
            took_ms = max(took_ms, int((time.monotonic() - started) * 1000) + 1)
            what = f"call {i}: {module} on {key}: {replies}"
            for other in replies[1:]:
                if mode == "acquire":
                    self.assert_alike("acquire", replies[0], other, took_ms, what)
                else:
                    self.assert_same_shape(mode, replies[0], other, took_ms, what)
            if op == "short":
                time.sleep(0.01)
            if mode == "lease" and isinstance(replies[0], list) and replies[0][0] == 1:
                held["m"] += 1
        self.assertGreater(held["m"], 20)  # the sequence took leases, not only denials
        # The keys ended alike: each path holds the same leases under the same ids, with
        # expiries (PEXPIRETIME) within the calls' milliseconds of each other.
        for n in range(3):
            s = self.client.zrange(f"s:L{n}", 0, -1) if self.client.type(f"s:L{n}") == b"zset" else []
            f = self.client.zrange(f"f:L{n}", 0, -1) if self.client.type(f"f:L{n}") == b"zset" else []
            self.assertEqual(sorted(s), sorted(f), n)
            in_use = self.client.execute_command("RL.LEASES", f"m:L{n}", 10000)[0]
            self.assertEqual(self.client.fcall("rl_leases", 1, f"s:L{n}", 10000)[0], in_use, n)
            self.assertEqual(self.client.fcall("rl_leases", 1, f"f:L{n}", 10000)[0], in_use, n)

    def test_past_maxmemory_a_release_still_frees_a_slot(self):
        # RL.RELEASE has no deny-oom; rl_release is flagged allow-oom to match, while a take
        # (RL.LEASE, rl_lease) is refused with the server's OOM error.
        self.client.execute_command("RL.LEASE", "m:L", 1, 100_000, "ID", "a")
        self.client.fcall("rl_lease", 1, "f:L", 1, 100_000, "a")
        self.client.config_set("maxmemory", 1)
        self.addCleanup(self.client.config_set, "maxmemory", 0)
        for take in (lambda: self.client.execute_command("RL.LEASE", "m:L", 2, 100_000, "ID", "b"),
                     lambda: self.client.fcall("rl_lease", 1, "f:L", 2, 100_000, "b")):
            with self.assertRaisesRegex(redis.exceptions.OutOfMemoryError, "maxmemory"):
                take()
        self.assertEqual(self.client.execute_command("RL.RELEASE", "m:L", "a"), 1)
        self.assertEqual(self.client.fcall("rl_release", 1, "f:L", "a"), 1)
        self.assertEqual(self.client.exists("m:L", "f:L"), 0)


if __name__ == "__main__":
    unittest.main()
