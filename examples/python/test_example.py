"""Tests for rate_limit.py (on the redis_rl library) against a real server with the module:
`python3 test_example.py`.

REDIS_URL names the server (examples/run.sh starts one). Nothing here starts Redis. Keys are
unique per run, and rates so slow (0.001 token/s) that no bucket refills during the test.
"""

import logging
import os
import socket
import threading
import unittest
import urllib.error
import urllib.request
import uuid
from wsgiref.simple_server import WSGIRequestHandler, make_server

from rate_limit import RateLimit, hello, make_client

REDIS_URL = os.environ.get("REDIS_URL")


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Served:
    """Serves a WSGI app on a free port in a thread; `get()` returns (status, headers)."""

    def __init__(self, app):
        self.httpd = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def get(self, path="/"):
        url = f"http://127.0.0.1:{self.httpd.server_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.headers
        except urllib.error.HTTPError as error:
            return error.code, error.headers

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url():
    """A redis:// URL on a port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}"


class WithServer(unittest.TestCase):
    def setUp(self):
        if not REDIS_URL:
            self.fail("set REDIS_URL to a server with the module (examples/run.sh does)")
        self.client = make_client(REDIS_URL, timeout_s=2)
        self.key = f"py-example:{uuid.uuid4()}"

    def serve(self, **options):
        served = Served(RateLimit(hello, self.client, key=lambda environ: self.key, **options))
        self.addCleanup(served.close)
        return served

    def test_allows_the_burst_then_answers_429_with_headers(self):
        served = self.serve(rate=0.001, capacity=3, on_error="closed")
        for remaining, reset in [(2, 1000), (1, 2000), (0, 3000)]:
            status, headers = served.get()
            self.assertEqual(status, 200)
            self.assertEqual(headers["X-RateLimit-Limit"], "3")
            self.assertEqual(headers["X-RateLimit-Remaining"], str(remaining))
            # One token per 1000 s: full again in 1000 s per token taken, rounded up.
            self.assertEqual(headers["X-RateLimit-Reset"], str(reset))
            self.assertNotIn("Retry-After", headers)
        status, headers = served.get()
        self.assertEqual(status, 429)
        # The next token is just under 1000 s away; seconds round up.
        self.assertEqual(headers["Retry-After"], "1000")
        self.assertEqual(headers["X-RateLimit-Limit"], "3")
        self.assertEqual(headers["X-RateLimit-Remaining"], "0")
        self.assertEqual(headers["X-RateLimit-Reset"], "3000")

    def test_a_cost_above_capacity_is_429_without_retry_after(self):
        served = self.serve(rate=0.001, capacity=3, cost=4, on_error="open")
        status, headers = served.get()
        self.assertEqual(status, 429)
        self.assertNotIn("Retry-After", headers)
        self.assertEqual(headers["X-RateLimit-Remaining"], "3")

    def test_a_request_without_a_key_is_not_limited(self):
        served = Served(RateLimit(hello, self.client, rate=0.001, capacity=1,
                                  key=lambda environ: None, on_error="closed"))
        self.addCleanup(served.close)
        for _ in range(3):
            status, headers = served.get()
            self.assertEqual(status, 200)
            self.assertNotIn("X-RateLimit-Limit", headers)


    def test_an_error_reply_applies_the_policy_too(self):
        # The key holds a string, so the server answers WRONGTYPE: no decision was made.
        self.client.set("rl:" + self.key, "not a bucket")
        self.addCleanup(self.client.delete, "rl:" + self.key)
        for on_error, want in [("open", 200), ("closed", 503)]:
            limiter = RateLimit(hello, self.client, rate=1, capacity=5, on_error=on_error,
                                key=lambda environ: self.key)
            served = Served(limiter)
            self.addCleanup(served.close)
            with self.assertLogs("rate_limit", logging.WARNING) as logs:
                status, _ = served.get()
            self.assertEqual(status, want, on_error)
            self.assertIn("WRONGTYPE", logs.output[0])


class WithoutServer(unittest.TestCase):
    """Redis is down: the configured policy decides, and is logged and counted."""

    def limited(self, on_error):
        return RateLimit(hello, make_client(dead_url()), rate=1, capacity=5, on_error=on_error)

    def test_fail_open_lets_requests_through(self):
        limiter = self.limited("open")
        served = Served(limiter)
        self.addCleanup(served.close)
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            for _ in range(2):
                status, headers = served.get()
                self.assertEqual(status, 200)
                self.assertNotIn("X-RateLimit-Remaining", headers)
        self.assertEqual((limiter.failed_open, limiter.failed_closed), (2, 0))
        self.assertEqual(len(logs.output), 1)  # once per outage
        self.assertIn("on_error='open'", logs.output[0])

    def test_fail_closed_refuses_with_503(self):
        limiter = self.limited("closed")
        served = Served(limiter)
        self.addCleanup(served.close)
        with self.assertLogs("redis_rl", logging.WARNING) as logs:
            status, headers = served.get()
        self.assertEqual(status, 503)
        self.assertEqual(headers["Retry-After"], "1")
        self.assertEqual((limiter.failed_open, limiter.failed_closed), (0, 1))
        self.assertIn("on_error='closed'", logs.output[0])

    def test_the_policy_must_be_chosen_and_limits_valid(self):
        client = make_client(dead_url())
        with self.assertRaises(TypeError):
            RateLimit(hello, client, rate=1, capacity=5)  # no on_error: no silent default
        for bad in [dict(on_error="maybe"), dict(rate=0), dict(capacity=0),
                    dict(rate=1, capacity=4e9), dict(cost=-1)]:
            options = dict(rate=1, capacity=5, on_error="open") | bad
            with self.assertRaises(ValueError, msg=str(bad)):
                RateLimit(hello, client, **options)


if __name__ == "__main__":
    unittest.main(verbosity=2)
