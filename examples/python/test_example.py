"""Tests for api.py and worker_pool.py (thin apps on the redis_rl library) against a real
server with the module: `python3 test_example.py`.

REDIS_URL names the server (examples/run.sh starts one). Nothing here starts Redis. Keys are
unique per run.
"""

import os
import socket
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid
from email.message import Message
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from redis_rl import Limit
from api import make_app
from worker_pool import run

REDIS_URL = os.environ.get("REDIS_URL")


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class Served:
    """Serves a WSGI app on a free port in a thread; `get()` returns (status, headers, body)."""

    def __init__(self, app: Any) -> None:
        self.httpd = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def get(self, path: str = "/") -> tuple[int, Message, bytes]:
        url = f"http://127.0.0.1:{self.httpd.server_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}"


class Api(unittest.TestCase):
    def serve(self, url: str, **options: Any) -> Served:
        served = Served(make_app(url, prefix=f"py-example:{uuid.uuid4()}:", **options))
        self.addCleanup(served.close)
        return served

    def test_burst_then_a_problem_429_with_the_rate_limit_fields(self) -> None:
        assert REDIS_URL is not None
        served = self.serve(REDIS_URL, limit=Limit(rate=0.001, capacity=3))
        for remaining, reset in [(2, 1000), (1, 2000), (0, 3000)]:
            status, headers, body = served.get()
            self.assertEqual((status, body), (200, b'{"hello": "world"}'))
            self.assertEqual(headers["RateLimit-Policy"], '"default";q=3;w=3000')
            self.assertEqual(headers["RateLimit"], f'"default";r={remaining};t={reset}')
            self.assertEqual(headers["X-RateLimit-Remaining"], str(remaining))
        status, headers, body = served.get()
        self.assertEqual((status, headers["Retry-After"]), (429, "1000"))
        self.assertEqual(headers["Content-Type"], "application/problem+json")
        self.assertIn(b'"status": 429', body)
        self.assertEqual([served.get("/health")[0] for _ in range(3)], [200] * 3)

    def test_without_redis_the_api_fails_open(self) -> None:
        served = self.serve(dead_url())
        for _ in range(7):
            status, headers, _ = served.get()
            self.assertEqual(status, 200)
            self.assertNotIn("RateLimit", headers)


class WorkerPool(unittest.TestCase):
    def test_workers_take_turns_at_the_vendors_rate(self) -> None:
        start = time.monotonic()
        assert REDIS_URL is not None
        results = run(REDIS_URL, range(12), workers=6, limit=Limit(rate=20, capacity=1),
                      key=f"py-example:{uuid.uuid4()}")
        took = time.monotonic() - start
        self.assertEqual(results, [j * j for j in range(12)])
        # 12 calls at 20/s with no burst: the 12th is 11 intervals (550 ms) after the first.
        self.assertGreaterEqual(took, 0.55 - 0.001)


if __name__ == "__main__":
    if not REDIS_URL:
        raise SystemExit("set REDIS_URL to a server with the module (examples/run.sh does)")
    unittest.main()
