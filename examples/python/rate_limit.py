"""WSGI middleware that rate-limits requests with the redis_rl library (clients/python).

    app = RateLimit(app, connect(os.environ["REDIS_URL"]), rate=5, capacity=10,
                    key=lambda environ: environ.get("HTTP_X_API_KEY"), on_error="open")

A thin app on the library: each request takes `cost` tokens from the bucket of its key;
allowed requests go through with the Decision's X-RateLimit-* headers added, refused ones get
429 with `Retry-After`. The library applies `on_error` (no default: "open", "closed" or
"local") when Redis cannot decide, logs it once per outage and counts it; this middleware
turns a "closed" decision into 503, lets an "open" one through without headers, and applies
the same choice to errors that are not outages (a key of another type, say), which the
library raises. The deny cache is on: a flooded, denied key costs Redis nothing until its
retry_after has passed.

Run `python3 rate_limit.py` for a demo server on 127.0.0.1:8000 (REDIS_URL, default
redis://127.0.0.1:6379).
"""

import logging
import os

import redis

from redis_rl import Limit, Limiter, connect
from redis_rl._core import check_cost

log = logging.getLogger("rate_limit")


def make_client(url, timeout_s=0.05):
    """A redis-py client for a limiter: short timeouts and no retries (the policy decides)."""
    return connect(url, timeout_ms=timeout_s * 1000)


def client_address(environ):
    """The default key: the client's address."""
    return environ.get("REMOTE_ADDR", "")


class RateLimit:
    """WSGI middleware: a token bucket per key, `rate` tokens/s, burst `capacity`."""

    def __init__(self, app, client, *, rate, capacity, on_error, cost=1,
                 key=client_address, prefix="rl:", instances=1):
        self.limit = Limit(rate, capacity)  # ValueError naming the argument
        if not callable(cost):
            check_cost(cost)
        self.limiter = Limiter(client, on_error=on_error, instances=instances, deny_cache=True,
                               timeout_ms=_timeout_ms(client))
        self.app = app
        self.cost = cost
        self.key = key
        self.prefix = prefix
        self.on_error = on_error

    @property
    def failed_open(self):
        return self.limiter.counters["open"]

    @property
    def failed_closed(self):
        return self.limiter.counters["closed"]

    def __call__(self, environ, start_response):
        key = self.key(environ)
        if key is None:  # not limited
            return self.app(environ, start_response)
        cost = self.cost(environ) if callable(self.cost) else self.cost
        try:
            decision = self.limiter.acquire(self.prefix + key, self.limit, cost)
        except redis.RedisError as error:  # not an outage: the same choice, said loudly
            log.warning("rate limiter error, failing %s: %s", "open" if self.on_error == "open" else "closed", error)
            if self.on_error == "open":
                return self.app(environ, start_response)
            return _unavailable(start_response)
        if decision.source == "open":
            return self.app(environ, start_response)
        if decision.source == "closed":
            return _unavailable(start_response)
        headers = list(decision.headers().items())
        if not decision.allowed:
            body = b"Too Many Requests\n"
            start_response("429 Too Many Requests", headers + [
                ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, response_headers + headers, exc_info)

        return self.app(environ, start_with_headers)


def _timeout_ms(client):
    """The client's socket timeout as the limiter's deadline (50 ms if it has none)."""
    timeout_s = client.connection_pool.connection_kwargs.get("socket_timeout") or 0.05
    return timeout_s * 1000


def _unavailable(start_response):
    body = b"Service Unavailable: rate limiter unavailable\n"
    start_response("503 Service Unavailable", [
        ("Retry-After", "1"), ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def hello(environ, start_response):
    """A stand-in application."""
    body = b"hello\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


if __name__ == "__main__":
    from wsgiref.simple_server import make_server

    logging.basicConfig(level=logging.INFO)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    app = RateLimit(hello, make_client(url), rate=1, capacity=5, on_error="open")
    print("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address")
    make_server("127.0.0.1", 8000, app).serve_forever()
