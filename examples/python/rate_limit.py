"""WSGI middleware that rate-limits requests with RL.ACQUIRE (redis-rl), using redis-py.

    app = RateLimit(app, make_client(os.environ["REDIS_URL"]),
                    rate=5, capacity=10, key=lambda environ: environ.get("HTTP_X_API_KEY"),
                    on_error="open")

Each request takes `cost` tokens from the bucket of its key. Allowed requests go through with
X-RateLimit-* headers added; refused ones get 429 with `Retry-After`.

When Redis cannot decide (unreachable, timed out, OOM, read-only replica, a key of another
type, ...) the middleware applies `on_error`, which has no default so every limit states it:

- "open": let the request through. For limits that protect capacity or fairness (a public
  API quota): a limiter outage must not become an API outage.
- "closed": refuse with 503. For limits that are a security control (logins, OTP, password
  resets): an attacker who can knock Redis over must not get unlimited tries.

Either way the decision is logged and counted (`failed_open`, `failed_closed`), and the client
in `make_client` has short timeouts and no retries, so a slow Redis degrades to the policy in
tens of milliseconds instead of piling up requests.

Run `python3 rate_limit.py` for a demo server on 127.0.0.1:8000 (REDIS_URL, default
redis://127.0.0.1:6379).
"""

import logging
import math
import os

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("rate_limit")

# The module's accepted ranges, checked at construction so a bad limit fails at start-up
# rather than on every request.
MIN_RATE, MAX_RATE = 0.000001, 1_000_000_000
MAX_CAPACITY = 1e15
MAX_REFILL_S = 3_153_600_000


def make_client(url, timeout_s=0.05):
    """A redis-py client for a limiter: short timeouts and no retries (the policy decides)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def client_address(environ):
    """The default key: the client's address."""
    return environ.get("REMOTE_ADDR", "")


def ceil_seconds(ms):
    """Milliseconds to whole seconds, rounded up (waiting that long is enough)."""
    return math.ceil(ms / 1000)


class RateLimit:
    """WSGI middleware: a token bucket per key, `rate` tokens/s, burst `capacity`."""

    def __init__(self, app, client, *, rate, capacity, on_error, cost=1,
                 key=client_address, prefix="rl:"):
        if on_error not in ("open", "closed"):
            raise ValueError('on_error must be "open" or "closed"')
        if not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError(f"rate must be from {MIN_RATE} to {MAX_RATE} tokens/s")
        if not 0 < capacity <= MAX_CAPACITY or capacity / rate > MAX_REFILL_S:
            raise ValueError("capacity must be above 0, at most 1e15 and refill within 100 years")
        if not (callable(cost) or (math.isfinite(cost) and cost >= 0)):
            raise ValueError("cost must be a finite number >= 0, or a function of the environ")
        self.app = app
        self.client = client
        self.rate = rate
        self.capacity = capacity
        self.cost = cost
        self.key = key
        self.prefix = prefix
        self.on_error = on_error
        self.failed_open = 0
        self.failed_closed = 0

    def __call__(self, environ, start_response):
        key = self.key(environ)
        if key is None:  # not limited
            return self.app(environ, start_response)
        cost = self.cost(environ) if callable(self.cost) else self.cost
        try:
            allowed, remaining, retry_after_ms, reset_after_ms = self.client.execute_command(
                "RL.ACQUIRE", self.prefix + key, self.rate, self.capacity, cost)
        except (redis.RedisError, OSError) as error:
            return self._unavailable(error, environ, start_response)

        headers = [
            ("X-RateLimit-Limit", _number(self.capacity)),
            ("X-RateLimit-Remaining", str(remaining)),
            ("X-RateLimit-Reset", str(ceil_seconds(reset_after_ms))),
        ]
        if not allowed:
            # retry_after_ms is -1 when cost > capacity: no wait helps, so no Retry-After.
            if retry_after_ms >= 0:
                headers.append(("Retry-After", str(ceil_seconds(retry_after_ms))))
            body = b"Too Many Requests\n"
            start_response("429 Too Many Requests", headers + [
                ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]

        def start_with_headers(status, response_headers, exc_info=None):
            return start_response(status, response_headers + headers, exc_info)

        return self.app(environ, start_with_headers)

    def _unavailable(self, error, environ, start_response):
        if self.on_error == "open":
            self.failed_open += 1
            log.warning("rate limiter unavailable, failing open: %s", error)
            return self.app(environ, start_response)
        self.failed_closed += 1
        log.warning("rate limiter unavailable, failing closed: %s", error)
        body = b"Service Unavailable: rate limiter unavailable\n"
        start_response("503 Service Unavailable", [
            ("Retry-After", "1"), ("Content-Type", "text/plain"),
            ("Content-Length", str(len(body)))])
        return [body]


def _number(value):
    """`10` rather than `10.0` for whole numbers."""
    return str(int(value)) if float(value).is_integer() else str(value)


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
