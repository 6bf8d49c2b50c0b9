"""The exact arguments each limit of clients/vectors/wire.json sends, read off a real server
with MONITOR: strings passed as str, JSON numbers as the int or float json gives, `per` as
the per= keyword (`{"timedelta": {...}}` as a `datetime.timedelta`), a null capacity left
out. On the module path, the `rate capacity cost` texts of RL.ACQUIRE; on the Functions path
and the Lua path (a server without the module), the 10 numbers of FCALL rl_acquire_packed and of
EVALSHA, packed in one argument of little-endian doubles, computed here from the case's texts
with exact rationals (clients/lua/rl.lua's header), not by the library. Sync and asyncio."""

import asyncio
import datetime
import json
import math
import os
import re
import socket
import struct
import unittest
from fractions import Fraction

import redis
import redis.asyncio

import redis_rl
from redis_rl import Limit, Limiter
from redis_rl import asyncio as rl_asyncio
from servers import ROOT, Server

CASES = json.load(open(os.path.join(ROOT, "clients", "vectors", "wire.json")))["cases"]
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def limit_of(case):
    per = case["per"]
    if isinstance(per, dict):
        per = datetime.timedelta(**per["timedelta"])
    kwargs = {} if per is None else {"per": per}
    if case["capacity"] is None:
        return Limit(case["rate"], **kwargs)
    return Limit(case["rate"], case["capacity"], **kwargs)


def exact(text):
    """An exact decimal ("0.1", "60") or `N/S` rate, as the module reads it."""
    count, slash, period = text.partition("/")
    return Fraction(count) / Fraction(period) if slash else Fraction(text)


def script_args(args):
    """The script's 10 numbers (clients/lua/rl.lua: D, then T, C, S, K as pairs q + r/D µs,
    then floor(C)) for an acquire with the exact `rate capacity cost` texts, when 1e6 / rate
    µs has a denominator below 2^31 (every case here)."""
    rate, cap, cost = (exact(a) for a in args)
    t_us = Fraction(10**6) / rate
    d = t_us.denominator
    assert d < 2**31 and cost <= cap, args

    def pair(x, rounding=math.floor):
        return divmod(rounding(x * d), d)

    numbers = [d, *pair(t_us), *pair(cap * t_us), *pair((cap - cost) * t_us),
               *pair(cost * t_us, math.ceil), math.floor(cap)]
    return [str(n) for n in numbers]


def packed(args):
    """script_args as the one argument the libraries send (ten little-endian doubles), as
    Monitor.next gives it: MONITOR writes a byte as Redis's sdscatrepr does (printable ASCII as
    itself, a quote and a backslash escaped, \\n \\r \\t \\a \\b, anything else \\xNN), and
    next() undoes the two escapes."""
    shown = []
    for b in struct.pack("<10d", *(int(n) for n in script_args(args))):
        c = chr(b)
        if c in "\\\"":
            shown.append("\\" + c)
        elif c in "\n\r\t\a\b":
            shown.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\a": "\\a", "\b": "\\b"}[c])
        elif 32 <= b < 127:
            shown.append(c)
        else:
            shown.append("\\x%02x" % b)
    return ["".join(shown).replace('\\"', '"').replace("\\\\", "\\")]


class Monitor:
    """A MONITOR connection: `commands(name)` reads what reached the server until `name`."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""
        self.sock.sendall(b"MONITOR\r\n")
        assert self.line() == "+OK"

    def line(self):
        while b"\r\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line.decode()

    def next(self, name):
        while True:
            args = [a.replace('\\"', '"').replace("\\\\", "\\") for a in QUOTED.findall(self.line())]
            if args and args[0].upper() == name:
                return args

    def close(self):
        self.sock.close()


class Wire(unittest.TestCase):
    def test_each_limit_sends_the_exact_arguments(self):
        s = Server()
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port), on_error="closed")
        self.addCleanup(limiter.client.close)
        monitor = Monitor(s.port)
        self.addCleanup(monitor.close)
        for i, case in enumerate(CASES):
            with self.subTest(case["name"]):
                cost = case["cost"]
                decision = limiter.acquire(f"wire:{i}", limit_of(case), cost)
                self.assertEqual(decision.source, "redis")
                got = monitor.next("RL.ACQUIRE")
                self.assertEqual(got[2:], case["args"], case)
                self.assertEqual(got[1], f"wire:{i}")

    def test_each_limit_sends_the_exact_script_numbers(self):
        s = Server(module=False)
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port), on_error="closed")
        self.addCleanup(limiter.client.close)
        monitor = Monitor(s.port)
        self.addCleanup(monitor.close)
        for i, case in enumerate(CASES):
            with self.subTest(case["name"]):
                decision = limiter.acquire(f"wire:{i}", limit_of(case), case["cost"])
                self.assertEqual(decision.source, "lua")
                got = monitor.next("EVALSHA")
                # sha, 1 key, the key, then the packed numbers: the short form, no mode.
                self.assertEqual(got[2:4], ["1", f"wire:{i}"], case)
                self.assertEqual(got[4:], packed(case["args"]), case)

    def test_only_a_one_key_acquire_leaves_out_the_mode(self):
        # The script's short form (80 packed bytes, no mode) is an acquire of one key; a peek,
        # a multi of one key and a refund still name their mode.
        s = Server(module=False)
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port), on_error="closed")
        self.addCleanup(limiter.client.close)
        monitor = Monitor(s.port)
        self.addCleanup(monitor.close)
        case = CASES[0]
        limit, want = limit_of(case), packed(case["args"])
        self.assertTrue(limiter.acquire("short", limit, case["cost"]).allowed)
        self.assertEqual(monitor.next("EVALSHA")[2:], ["1", "short", *want])
        limiter.peek("short", limit, case["cost"])
        self.assertEqual(monitor.next("EVALSHA")[2:], ["1", "short", "peek", *want])
        limiter.acquire_all([("short", limit, case["cost"])])
        self.assertEqual(monitor.next("EVALSHA")[2:], ["1", "short", "multi", *want])
        limiter.refund("short", limit, case["cost"])
        self.assertEqual(monitor.next("EVALSHA")[2:5], ["1", "short", "refund"])

    def test_each_limit_sends_the_exact_numbers_to_the_functions_library(self):
        s = Server(module=False)
        self.addCleanup(s.close)
        with redis.Redis(port=s.port) as admin:
            redis_rl.load_functions(admin)
        limiter = Limiter(redis.Redis(port=s.port), on_error="closed")
        self.addCleanup(limiter.client.close)
        monitor = Monitor(s.port)
        self.addCleanup(monitor.close)
        for i, case in enumerate(CASES):
            with self.subTest(case["name"]):
                decision = limiter.acquire(f"wire:{i}", limit_of(case), case["cost"])
                self.assertEqual(decision.source, "functions")
                got = monitor.next("FCALL")
                # The function, 1 key, the key, then the numbers (no mode).
                self.assertEqual(got[1:4], ["rl_acquire_packed", "1", f"wire:{i}"], case)
                self.assertEqual(got[4:], packed(case["args"]), case)


class AsyncWire(unittest.IsolatedAsyncioTestCase):
    async def check(self, module, command):
        s = Server(module=module)
        self.addCleanup(s.close)
        if command == "FCALL":
            with redis.Redis(port=s.port) as admin:
                redis_rl.load_functions(admin)
        client = redis.asyncio.Redis(port=s.port)
        self.addAsyncCleanup(client.aclose)
        limiter = rl_asyncio.Limiter(client, on_error="closed")
        monitor = Monitor(s.port)
        self.addCleanup(monitor.close)
        for i, case in enumerate(CASES):
            with self.subTest(case["name"]):
                decision = await limiter.acquire(f"wire:{i}", limit_of(case), case["cost"])
                source = {"RL.ACQUIRE": "redis", "FCALL": "functions"}.get(command, "lua")
                self.assertEqual(decision.source, source)
                # MONITOR is read in a thread: this loop's client must go on running meanwhile.
                got = await asyncio.to_thread(monitor.next, command)
                if module:
                    self.assertEqual(got[1:], [f"wire:{i}", *case["args"]], case)
                elif command == "FCALL":
                    self.assertEqual(got[1:4], ["rl_acquire_packed", "1", f"wire:{i}"], case)
                    self.assertEqual(got[4:], packed(case["args"]), case)
                else:
                    self.assertEqual(got[2:4], ["1", f"wire:{i}"], case)
                    self.assertEqual(got[4:], packed(case["args"]), case)

    async def test_module_path(self):
        await self.check(True, "RL.ACQUIRE")

    async def test_lua_path(self):
        await self.check(False, "EVALSHA")

    async def test_functions_path(self):
        await self.check(False, "FCALL")


class Replies(unittest.TestCase):
    """A one-key acquire on the script path is answered packed (32 bytes, four doubles), which
    the library reads as bytes whatever the client decodes: a client with decode_responses,
    on RESP2 and RESP3, sync and asyncio, gets the decisions a plain client gets, on every
    path."""

    def test_decoding_clients_get_the_same_decisions_on_every_path(self):
        limit = Limit(1, 3, per=3600)
        for path in ("module", "functions", "lua"):
            s = Server(module=path == "module")
            self.addCleanup(s.close)
            if path == "functions":
                with redis.Redis(port=s.port) as admin:
                    redis_rl.load_functions(admin)
            for n, options in enumerate(({}, {"decode_responses": True},
                                         {"decode_responses": True, "protocol": 3})):
                with self.subTest(path=path, options=options):
                    client = redis.Redis(port=s.port, **options)
                    self.addCleanup(client.close)
                    limiter = Limiter(client, on_error="closed")
                    got = [limiter.acquire(f"{path}:{n}", limit) for _ in range(4)]
                    self.assertEqual({d.source for d in got}, {"redis" if path == "module" else path})
                    self.assertEqual([(d.allowed, d.remaining) for d in got],
                                     [(True, 2), (True, 1), (True, 0), (False, 0)])
                    self.assertTrue(3_590_000 <= got[3].retry_after_ms <= 3_600_000, got[3])

                    async def run():
                        aclient = redis.asyncio.Redis(port=s.port, **options)
                        try:
                            alimiter = rl_asyncio.Limiter(aclient, on_error="closed")
                            return [await alimiter.acquire(f"{path}:async:{n}", limit) for _ in range(4)]
                        finally:
                            await aclient.aclose()
                    got = asyncio.run(run())
                    self.assertEqual([(d.allowed, d.remaining) for d in got],
                                     [(True, 2), (True, 1), (True, 0), (False, 0)])


if __name__ == "__main__":
    unittest.main()
