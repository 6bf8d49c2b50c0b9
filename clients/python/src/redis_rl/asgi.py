"""Rate limits for ASGI apps (Starlette, FastAPI) on `redis_rl.asyncio.Limiter`.

    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit(10, 20))

`RateLimitMiddleware` limits every HTTP request; `limit_route` one endpoint. Both take the
options of `redis_rl.http.Policy`; a limit, key or cost function and `skip` get the ASGI
scope, and `on_limited(scope, decision, headers)` returns an ASGI app (a Starlette `Response`
is one). Each of these hooks may be sync or async: what it returns is awaited when it is
awaitable. The limiter's failure policy, deny cache and Lua fallback apply to each request
unchanged.

Each decision is recorded in the scope (`scope["redis_rl"]`), so a request limited by the
middleware and a route decorator gets one set of header fields for both
(`redis_rl.http.header_fields`).
"""

import functools
import inspect
from typing import Any, Callable

from .http import FIELD_NAMES, PROBLEM_TYPE, InFlight, Policy, header_fields
from .hold import AsyncHeld

__all__ = ["RateLimitMiddleware", "limit_route", "Policy", "InFlight"]

_DECIDED = "redis_rl"  # the scope's list of (policy, decision) for this request
_KEYS = "redis_rl.keys"  # the scope's Redis keys used for this request, and by which policy


async def _value(hook, *args):
    """A hook's value: called, and awaited when what it returns is awaitable."""
    value = hook(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


def _header_reader(scope):
    headers = {}
    for name, value in scope.get("headers") or ():
        # Repeated fields (X-Forwarded-For from several proxies) are joined, as HTTP allows.
        name = name.decode("latin-1").lower()
        value = value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return lambda name: headers.get(name.lower())


def _peer(scope):
    client = scope.get("client")
    return client[0] if client else None


async def decide(policy, scope):
    """The decision and header fields for one request, or None when `skip` lets it pass. The
    fields cover every limit that decided this request so far (see the module's docs)."""
    if policy.skip is not None and await _value(policy.skip, scope):
        return None
    computed = await _value(policy.key, scope) if callable(policy.key) else None
    limit = await _value(policy.limit_for, scope)
    key = policy.key_for(scope, _peer(scope), _header_reader(scope), computed, limit)
    policy.claim(scope.setdefault(_KEYS, {}), key)
    cost = await _value(policy.cost_for, scope)
    decision = await policy.limiter.acquire(key, limit, cost)
    decided = scope.setdefault(_DECIDED, [])
    decided.append((policy, decision))
    return decision, header_fields(decided)


async def _limited_response(policy, scope, decision, headers):
    """The app that answers a request over the limit: `on_limited`'s, or the problem+json."""
    if policy.on_limited is not None:
        return await _value(policy.on_limited, scope, decision, headers)
    return None


def _raw(headers):
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]


async def _send_problem(send, decision, headers):
    body = Policy.problem(decision)
    raw = _raw(headers) + [(b"content-type", PROBLEM_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 429, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RateLimitMiddleware:
    """ASGI middleware: a 429 (application/problem+json, RFC 9457) for requests over the
    limit, the rate-limit header fields on every response it decided.

    `in_flight` (a `redis_rl.http.InFlight`, a limit, or `(limit, ttl_ms)`) adds an in-flight
    limit per key: a lease taken before the app runs, after the rate limit allowed the request
    (`limit` may then be None for an in-flight limit alone), and released once the last body
    chunk is sent, the client disconnects (http.disconnect) or the app raises; renewed while a
    long response streams. `on_limited` gets the Lease as its decision when that limit refuses.
    """

    def __init__(self, app: Any, limiter: Any, limit: Any = None, *, in_flight: Any = None,
                 **options: Any) -> None:
        if limit is None and in_flight is None:
            raise TypeError("RateLimitMiddleware needs a limit, an in_flight limit, or both")
        self.app = app
        self.policy = Policy(limiter, limit, **options)
        self.in_flight = InFlight.of(in_flight)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        policy = self.policy
        if policy.limit is not None:
            decided = await decide(policy, scope)
            if decided is None:
                return await self.app(scope, receive, send)
            decision, headers = decided
            if not decision.allowed:
                response = await _limited_response(policy, scope, decision, headers)
                if response is not None:
                    return await response(scope, receive, send)
                return await _send_problem(send, decision, headers)

            async def send_with_headers(message):
                if message["type"] == "http.response.start":
                    # One set of fields for every limit of this request: a route decorator
                    # inside may have written its own, which this set (holding it too)
                    # replaces.
                    fields = header_fields(scope[_DECIDED])
                    kept = [(n, v) for n, v in message.get("headers") or ()
                            if n.decode("latin-1").lower() not in FIELD_NAMES]
                    message = dict(message, headers=kept + _raw(fields))
                await send(message)
        else:
            if policy.skip is not None and await _value(policy.skip, scope):
                return await self.app(scope, receive, send)
            send_with_headers = send
        if self.in_flight is None:
            return await self.app(scope, receive, send_with_headers)
        return await self._in_flight(scope, receive, send_with_headers)

    async def _in_flight(self, scope, receive, send):
        policy, in_flight = self.policy, self.in_flight
        computed = await _value(policy.key, scope) if callable(policy.key) else None
        suffix = policy.key_suffix(scope, _peer(scope), _header_reader(scope), computed)
        lease = await policy.limiter.lease(in_flight.key(policy, suffix), in_flight.limit, in_flight.ttl_ms)
        if not lease.allowed:
            headers = InFlight.headers(scope.get(_DECIDED, []), lease)
            response = await _limited_response(policy, scope, lease, headers)
            if response is not None:
                return await response(scope, receive, send)
            body = InFlight.problem(lease)
            raw = _raw(headers) + [(b"content-type", PROBLEM_TYPE.encode()),
                                   (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 429, "headers": raw})
            await send({"type": "http.response.body", "body": body})
            return
        held = AsyncHeld(policy.limiter, lease, in_flight.renew)

        async def send_then_release(message):
            await send(message)
            # The last chunk is out: the response is done, whatever the app does after it
            # (a background task) holds no slot.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await held.close()

        async def receive_watching():
            message = await receive()
            if message["type"] == "http.disconnect":
                await held.close()
            return message

        try:
            await self.app(scope, receive_watching, send_then_release)
        finally:
            await held.close()


def limit_route(limiter: Any, limit: Any, **options: Any) -> Callable[[Any], Any]:
    """A decorator for one Starlette or FastAPI endpoint, `async def` or plain `def` (run in
    the thread pool, as FastAPI runs one). It finds the request among the arguments whatever
    the parameter's name (a FastAPI endpoint that takes none is given one, hidden). Over the
    limit it returns the 429 without running the endpoint; otherwise it adds the header fields
    to the Response the endpoint returns (an endpoint returning plain data gets none: return a
    Response, or use the middleware)."""
    policy = Policy(limiter, limit, **options)

    def wrap(endpoint):
        from starlette.requests import HTTPConnection, Request

        signature = inspect.signature(endpoint)

        @functools.wraps(endpoint)
        async def limited(*args, **kwargs):
            from starlette.concurrency import run_in_threadpool
            from starlette.responses import Response

            hidden = kwargs.pop(_HIDDEN, None)
            request = hidden or next((a for a in (*args, *kwargs.values()) if isinstance(a, HTTPConnection)), None)
            if request is None:
                raise TypeError(f"limit_route: {endpoint.__name__} was called without the request")

            async def run():
                if inspect.iscoroutinefunction(endpoint):
                    return await endpoint(*args, **kwargs)
                response = await run_in_threadpool(endpoint, *args, **kwargs)
                return await response if inspect.isawaitable(response) else response

            decided = await decide(policy, request.scope)
            if decided is None:
                return await run()
            decision, headers = decided
            if not decision.allowed:
                response = await _limited_response(policy, request.scope, decision, headers)
                if response is not None:
                    return response
                return Response(Policy.problem(decision), status_code=429, headers=dict(headers),
                                media_type=PROBLEM_TYPE)
            response = await run()
            if isinstance(response, Response):
                for name, value in headers:
                    response.headers[name] = value
            return response

        # FastAPI passes what the signature asks for, and one request parameter at most: an
        # endpoint that takes none is made to ask for it by a name of our own, its own
        # parameters untouched. Starlette passes the request itself and reads no signature.
        if not _takes_request(endpoint, signature, HTTPConnection):
            extra = inspect.Parameter(_HIDDEN, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
            params = list(signature.parameters.values())
            at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
            limited.__signature__ = signature.replace(parameters=params[:at] + [extra] + params[at:])
        return limited

    return wrap


_HIDDEN = "redis_rl_request"


def _takes_request(endpoint, signature, connection_type):
    """Whether a parameter of `endpoint` is annotated as a Request (or WebSocket)."""
    import typing

    try:
        hints = typing.get_type_hints(endpoint)
    except Exception:  # an annotation that does not resolve here: read them as written
        hints = {}
    for name, param in signature.parameters.items():
        annotation = hints.get(name, param.annotation)
        if isinstance(annotation, type) and issubclass(annotation, connection_type):
            return True
        if isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] in ("Request", "HTTPConnection"):
            return True
    return False
