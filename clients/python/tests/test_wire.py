"""The exact `rate capacity cost` arguments each limit of clients/vectors/wire.json sends to
the module, read off a real server with MONITOR: strings passed as str, JSON numbers as the
int or float json gives, `per` as the per= keyword, a null capacity left out."""

import json
import os
import re
import socket
import unittest

import redis

from redis_rl import Limit, Limiter
from servers import ROOT, Server

CASES = json.load(open(os.path.join(ROOT, "clients", "vectors", "wire.json")))["cases"]
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def limit_of(case):
    kwargs = {} if case["per"] is None else {"per": case["per"]}
    if case["capacity"] is None:
        return Limit(case["rate"], **kwargs)
    return Limit(case["rate"], case["capacity"], **kwargs)


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


if __name__ == "__main__":
    unittest.main()
