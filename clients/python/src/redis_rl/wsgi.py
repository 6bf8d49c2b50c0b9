"""Rate limits for WSGI apps (Flask, any WSGI app) on the sync `redis_rl.Limiter`.

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=Limit(10, 20))

`RateLimitMiddleware` limits every request; `limit_route` one Flask view. Both take the
options of `redis_rl.http.Policy`; a key or cost function and `skip` get the WSGI environ, and
`on_limited(environ, decision, headers)` returns a WSGI app (a Flask or Werkzeug `Response`
is one). Any of these may be `async def`: it is run to completion (`redis_rl.http.run_awaitable`). `limit_route` is Flask's; Django has its own middleware and view decorator in
`redis_rl.django`. The limiter's
failure policy, deny cache and Lua fallback apply to each request unchanged.

Each decision is recorded in the environ (`environ["redis_rl"]`), so a request limited by
the middleware and a route decorator gets one set of header fields for both
(`redis_rl.http.header_fields`).
"""

import functools
import inspect
from typing import Any, Callable

from .http import FIELD_NAMES, PROBLEM_TYPE, InFlight, Policy, call_hook, header_fields
from .hold import Held

__all__ = ["RateLimitMiddleware", "limit_route", "Policy", "InFlight"]

_REASON = "429 Too Many Requests"
_DECIDED = "redis_rl"  # the environ's list of (policy, decision) for this request
_KEYS = "redis_rl.keys"  # the environ's Redis keys used for this request, and by which policy


def _header_reader(environ):
    def header(name):
        if name.lower() == "content-type":
            return environ.get("CONTENT_TYPE")
        return environ.get("HTTP_" + name.upper().replace("-", "_"))

    return header


def decide(policy, environ):
    """The decision and header fields for one request, or None when `skip` lets it pass."""
    # Each hook may be `async def`: run to completion (a coroutine is true: as `skip`'s
    # value it would let every request through unlimited).
    if policy.skip is not None and call_hook(policy.skip, environ):
        return None
    computed = call_hook(policy.key, environ) if callable(policy.key) else None
    limit = call_hook(policy.limit_for, environ)
    key = policy.key_for(environ, environ.get("REMOTE_ADDR"), _header_reader(environ), computed, limit)
    policy.claim(environ.setdefault(_KEYS, {}), key)
    decision = policy.limiter.acquire(key, limit, call_hook(policy.cost_for, environ))
    decided = environ.setdefault(_DECIDED, [])
    decided.append((policy, decision))
    return decision, header_fields(decided)


def _sync_policy(limiter, limit, options):
    """The policy of a WSGI middleware or decorator: WSGI is sync, so is its limiter (an
    asyncio limiter's decision would be a coroutine)."""
    if inspect.iscoroutinefunction(getattr(limiter, "acquire", None)):
        raise TypeError("limiter must be the sync redis_rl.Limiter: WSGI is sync "
                        "(redis_rl.asgi takes redis_rl.asyncio.Limiter)")
    return Policy(limiter, limit, **options)


def _problem_app(decision, headers):
    body = Policy.problem(decision)

    def app(environ, start_response):
        start_response(_REASON, list(headers) + [("Content-Type", PROBLEM_TYPE),
                                                 ("Content-Length", str(len(body)))])
        return [body]

    return app


class RateLimitMiddleware:
    """WSGI middleware: a 429 (application/problem+json, RFC 9457) for requests over the
    limit, the rate-limit header fields on every response it decided.

    `in_flight` (a `redis_rl.http.InFlight`, a limit, or `(limit, ttl_ms)`) adds an in-flight
    limit per key: a lease taken before the app runs, after the rate limit allowed the request
    (`limit` may then be None for an in-flight limit alone), and released when the server
    closes the response iterable (PEP 3333's `close()`, after the last chunk or when the client
    went away) or the app raises; renewed by a thread while a long response streams.
    `on_limited` gets the Lease as its decision when that limit refuses.
    """

    def __init__(self, app: Any, limiter: Any, limit: Any = None, *, in_flight: Any = None,
                 **options: Any) -> None:
        if limit is None and in_flight is None:
            raise TypeError("RateLimitMiddleware needs a limit, an in_flight limit, or both")
        self.app = app
        self.policy = _sync_policy(limiter, limit, options)
        self.in_flight = InFlight.of(in_flight)

    def __call__(self, environ: Any, start_response: Any) -> Any:
        policy = self.policy
        if policy.limit is not None:
            decided = decide(policy, environ)
            if decided is None:
                return self.app(environ, start_response)
            decision, headers = decided
            if not decision.allowed:
                on_limited = policy.on_limited
                app = call_hook(on_limited, environ, decision, headers) if on_limited else _problem_app(decision, headers)
                return app(environ, start_response)

            def start_with_headers(status, response_headers, exc_info=None):
                # One set of fields for every limit of this request: a route decorator inside
                # may have written its own, which this set (holding it too) replaces.
                kept = [(n, v) for n, v in response_headers if n.lower() not in FIELD_NAMES]
                return start_response(status, kept + header_fields(environ[_DECIDED]), exc_info)
        else:
            if policy.skip is not None and call_hook(policy.skip, environ):
                return self.app(environ, start_response)
            start_with_headers = start_response
        if self.in_flight is None:
            return self.app(environ, start_with_headers)
        return self._in_flight(environ, start_with_headers)

    def _in_flight(self, environ, start_response):
        policy, in_flight = self.policy, self.in_flight
        computed = call_hook(policy.key, environ) if callable(policy.key) else None
        suffix = policy.key_suffix(environ, environ.get("REMOTE_ADDR"), _header_reader(environ), computed)
        lease = policy.limiter.lease(in_flight.key(policy, suffix), in_flight.limit, in_flight.ttl_ms)
        if not lease.allowed:
            headers = InFlight.headers(environ.get(_DECIDED, []), lease)
            if policy.on_limited is not None:
                return call_hook(policy.on_limited, environ, lease, headers)(environ, start_response)
            body = InFlight.problem(lease)
            start_response(_REASON, headers + [("Content-Type", PROBLEM_TYPE),
                                               ("Content-Length", str(len(body)))])
            return [body]
        held = Held(policy.limiter, lease, in_flight.renew)
        try:
            result = self.app(environ, start_response)
        except BaseException:
            held.close()
            raise
        return _Releasing(result, held)


class _Releasing:
    """The app's response iterable, releasing the request's lease when the server closes it
    (PEP 3333: always, after the last chunk or when the client went away)."""

    def __init__(self, result, held):
        self.result, self.held = result, held

    def __iter__(self):
        return iter(self.result)

    def close(self):
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            self.held.close()


def limit_route(limiter: Any, limit: Any, **options: Any) -> Callable[[Any], Any]:
    """A decorator for one Flask view (put it under `@app.route`). Over the limit the view
    does not run and the 429 is returned; otherwise the header fields are added to its
    response."""
    policy = _sync_policy(limiter, limit, options)

    def wrap(view):
        @functools.wraps(view)
        def limited(*args, **kwargs):
            import flask

            # An `async def` view runs as Flask runs it (ensure_sync) rather than returning a
            # coroutine.
            run_view = flask.current_app.ensure_sync(view)
            decided = decide(policy, flask.request.environ)
            if decided is None:
                return run_view(*args, **kwargs)
            decision, headers = decided
            if not decision.allowed:
                if policy.on_limited is not None:
                    return call_hook(policy.on_limited, flask.request.environ, decision, headers)
                return flask.Response(Policy.problem(decision), status=429, headers=headers,
                                      content_type=PROBLEM_TYPE)
            response = flask.make_response(run_view(*args, **kwargs))
            for name, value in headers:
                response.headers[name] = value
            return response

        return limited

    return wrap
