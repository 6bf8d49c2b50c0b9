"""An HTTP API rate-limited with redis_rl.wsgi: a thin app on the library's public API.

Each client address gets a bucket of 5 requests at once, then 1 per second. Over the limit
the API answers 429 with an application/problem+json body, Retry-After, the RateLimit-Policy
and RateLimit fields (draft-ietf-httpapi-ratelimit-headers-10) and X-RateLimit-*. /health is
never limited. If Redis cannot decide, the limiter's on_error="open" lets requests through.

    python3 api.py          # http://127.0.0.1:8000/ (REDIS_URL, default redis://127.0.0.1:6379)
"""

import json
import os
from typing import Any, Callable, Iterable

from redis_rl import Limit, Limiter, connect
from redis_rl.wsgi import RateLimitMiddleware


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The API itself: one JSON greeting."""
    body = json.dumps({"hello": "world"}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def make_app(redis_url: str, limit: Limit = Limit(rate=1, capacity=5), on_error: str = "open",
             **options: Any) -> RateLimitMiddleware:
    """The API behind its rate limit; `options` go to the middleware (key, cost, prefix …)."""
    limiter = Limiter(connect(redis_url), on_error=on_error, deny_cache=True)
    return RateLimitMiddleware(hello, limiter=limiter, limit=limit,
                               skip=lambda environ: environ.get("PATH_INFO") == "/health", **options)


if __name__ == "__main__":
    from wsgiref.simple_server import make_server

    app = make_app(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    print("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address")
    make_server("127.0.0.1", 8000, app).serve_forever()
