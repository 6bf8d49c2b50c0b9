"""The middlewares' in-flight limit (`in_flight=`) against real servers: 200 concurrent requests
through the ASGI middleware (one event loop) and through the WSGI middleware behind a threaded
WSGI server never run more handlers at once than the limit, and leave no lease behind; a
streamed body holds its lease until its last chunk; a client that disconnects, and a handler
that raises, give the slot back. The concurrency is measured inside the handlers."""

import asyncio
import http.client
import random
import socketserver
import threading
import time
import unittest
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
import redis.asyncio

from redis_rl import Limit, Limiter
from redis_rl import asgi, wsgi
from redis_rl import asyncio as rl_asyncio
from redis_rl.http import InFlight
from servers import Server

LIMIT = 10
KEY = "rl:http:inflight:10:ip:203.0.113.7"  # the default key space of in_flight=10
ONE = "rl:http:inflight:1:ip:203.0.113.7"  # of in_flight=1


def backoff(tries):
    """A client's sleep after its tries-th 429: from 10 ms doubling up to 0.5 s, jittered (the
    retriers would otherwise keep the one event loop or the two cores busy)."""
    return min(0.5, 0.01 * 2 ** tries) * random.uniform(0.5, 1.5)


def held(server, key=KEY):
    with redis.Redis(port=server.port) as admin:
        return admin.execute_command("RL.LEASES", key, 10000)[0]


class Gauge:
    """How many handlers run at once, and the most seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def enter(self):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self):
        with self.lock:
            self.now -= 1


def scope(path="/"):
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"t")],
            "client": ("203.0.113.7", 5000), "server": ("t", 80)}


async def call(app, path="/", receive=None):
    """One request through an ASGI app: (status, body, headers)."""
    sent = []

    asked = []

    async def no_body():
        # The request once, then nothing until the test ends, as a client that stays.
        if asked:
            await asyncio.Event().wait()
        asked.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope(path), receive or no_body, send)
    start = sent[0]
    return (start["status"], b"".join(m.get("body", b"") for m in sent[1:]),
            {k.decode(): v.decode() for k, v in start["headers"]})


class Asgi(unittest.TestCase):
    """Plain event loops (asyncio.run): IsolatedAsyncioTestCase's debug mode slows each await."""

    def setUp(self):
        self.server = Server()
        self.addCleanup(self.server.close)

    def run_async(self, main):
        async def wrapped():
            client = redis.asyncio.Redis(port=self.server.port, max_connections=50)
            try:
                return await main(rl_asyncio.Limiter(client, on_error="closed", timeout_ms=5000))
            finally:
                await client.aclose()

        return asyncio.run(wrapped())

    def test_200_concurrent_requests_never_exceed_the_in_flight_limit(self):
        gauge = Gauge()

        async def handler(scope, receive, send):
            gauge.enter()
            await asyncio.sleep(0.01)
            gauge.leave()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        async def main(limiter):
            app = asgi.RateLimitMiddleware(handler, limiter=limiter, in_flight=LIMIT)
            statuses = []

            async def client():
                tries = 0
                while True:  # a client told 429 tries again, backing off
                    status, body, headers = await call(app)
                    statuses.append(status)
                    if status == 200:
                        return
                    self.assertEqual(status, 429)
                    self.assertIn("Retry-After", {k.title(): v for k, v in headers.items()})
                    await asyncio.sleep(backoff(tries))
                    tries += 1

            await asyncio.gather(*(client() for _ in range(200)))
            return statuses

        statuses = self.run_async(main)
        self.assertEqual(statuses.count(200), 200)
        self.assertGreater(statuses.count(429), 0)  # the limit did refuse some
        self.assertEqual(gauge.peak, LIMIT)
        self.assertEqual(held(self.server), 0)

    def test_a_streamed_body_holds_its_lease_until_the_last_chunk(self):
        from starlette.responses import StreamingResponse

        async def main(limiter):
            go_on = asyncio.Event()
            seen = []

            async def chunks():
                yield b"first "
                await go_on.wait()
                yield b"last"

            async def app(scope, receive, send):
                await StreamingResponse(chunks())(scope, receive, send)

            mw = asgi.RateLimitMiddleware(app, limiter=limiter, in_flight=(1, 60_000))
            sent = []
            first_sent = asyncio.Event()

            async def send(message):
                sent.append(message)
                if message.get("body") == b"first ":
                    first_sent.set()

            async def receive():
                await asyncio.Event().wait()  # the client stays

            task = asyncio.ensure_future(mw(scope(), receive, send))
            await first_sent.wait()
            seen.append(held(self.server, ONE))  # streaming: held
            # A second request meanwhile: refused (were it let in, it would wait on the same
            # stream: the timeout turns that into a failure).
            status, _, headers = await asyncio.wait_for(call(mw), 10)
            seen.append(status)
            go_on.set()
            await task
            seen.append(held(self.server, ONE))  # done: released
            seen.append(b"".join(m.get("body", b"") for m in sent[1:]))
            return seen

        self.assertEqual(self.run_async(main), [1, 429, 0, b"first last"])

    def test_a_client_disconnect_releases_before_the_handler_ends(self):
        async def main(limiter):
            disconnected = asyncio.Event()
            finish = asyncio.Event()
            seen = []

            async def app(scope, receive, send):
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"part", "more_body": True})
                message = await receive()
                seen.append(message["type"])
                disconnected.set()
                await finish.wait()  # still running when the slot is checked

            mw = asgi.RateLimitMiddleware(app, limiter=limiter, in_flight=(1, 60_000))
            gone = asyncio.Event()

            async def receive():
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message):
                if message.get("more_body"):
                    seen.append(held(self.server, ONE))
                    gone.set()

            task = asyncio.ensure_future(mw(scope(), receive, send))
            await disconnected.wait()
            seen.append(held(self.server, ONE))
            finish.set()
            await task
            return seen

        self.assertEqual(self.run_async(main), [1, "http.disconnect", 0])

    def test_an_exception_in_the_app_releases(self):
        async def main(limiter):
            async def app(scope, receive, send):
                raise RuntimeError("the handler failed")

            mw = asgi.RateLimitMiddleware(app, limiter=limiter, limit=Limit(100, 100), in_flight=1)
            with self.assertRaises(RuntimeError):
                await call(mw)
            return held(self.server, ONE)

        self.assertEqual(self.run_async(main), 0)


class Wsgi(unittest.TestCase):
    def test_200_concurrent_requests_through_a_threaded_server(self):
        s = Server()
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port, max_connections=300), on_error="closed",
                          timeout_ms=5000)
        self.addCleanup(limiter.client.close)
        gauge = Gauge()

        def handler(environ, start_response):
            gauge.enter()
            # Long enough that, with 200 callers waiting, all 10 leases are held at once even
            # on a busy machine (at 10 ms the peak was sometimes 9 under a parallel build).
            time.sleep(0.05)
            gauge.leave()
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]

        app = wsgi.RateLimitMiddleware(handler, limiter=limiter, in_flight=InFlight(LIMIT, 60_000))

        class Threaded(socketserver.ThreadingMixIn, WSGIServer):
            daemon_threads = True
            request_queue_size = 512

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):
                pass

        httpd = make_server("127.0.0.1", 0, app, server_class=Threaded, handler_class=Quiet)
        serving = threading.Thread(target=httpd.serve_forever, daemon=True)
        serving.start()
        self.addCleanup(httpd.server_close)
        self.addCleanup(httpd.shutdown)
        port = httpd.server_address[1]
        statuses, lock = [], threading.Lock()

        def client():
            tries = 0
            while True:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("GET", "/")
                    response = conn.getresponse()
                    response.read()
                finally:
                    conn.close()
                with lock:
                    statuses.append(response.status)
                if response.status == 200:
                    return
                time.sleep(backoff(tries))
                tries += 1

        threads = [threading.Thread(target=client) for _ in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(statuses.count(200), 200)
        self.assertEqual(set(statuses), {200, 429})
        self.assertEqual(gauge.peak, LIMIT)
        deadline = time.monotonic() + 5  # the last close() may run just after the response
        while held(s, "rl:http:inflight:10:ip:127.0.0.1") and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(held(s, "rl:http:inflight:10:ip:127.0.0.1"), 0)

    def test_the_lease_is_held_until_the_server_closes_the_iterable(self):
        s = Server()
        self.addCleanup(s.close)
        limiter = Limiter(redis.Redis(port=s.port), on_error="closed")
        self.addCleanup(limiter.client.close)

        def streamed(environ, start_response):
            start_response("200 OK", [])
            yield b"one"
            yield b"two"

        def failing(environ, start_response):
            raise RuntimeError("the handler failed")

        app = wsgi.RateLimitMiddleware(streamed, limiter=limiter, in_flight=1)
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "203.0.113.7"}
        result = app(dict(environ), lambda status, headers, exc_info=None: None)
        self.assertEqual(list(result), [b"one", b"two"])
        self.assertEqual(held(s, "rl:http:inflight:1:ip:203.0.113.7"), 1)  # not closed yet
        statuses = []
        denied = app(dict(environ), lambda status, headers, exc_info=None: statuses.append((status, dict(headers))))
        self.assertEqual(statuses[0][0], "429 Too Many Requests")
        self.assertEqual(statuses[0][1]["Retry-After"], "60")
        self.assertIn(b"Too many requests in flight (at most 1)", b"".join(denied))
        result.close()
        self.assertEqual(held(s, "rl:http:inflight:1:ip:203.0.113.7"), 0)
        with self.assertRaises(RuntimeError):
            wsgi.RateLimitMiddleware(failing, limiter=limiter, in_flight=1)(
                dict(environ), lambda *a: None)
        self.assertEqual(held(s, "rl:http:inflight:1:ip:203.0.113.7"), 0)


if __name__ == "__main__":
    unittest.main()
