"""Rate limits for ASGI apps (Starlette, FastAPI) on `redis_rl.asyncio.Limiter`.

    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit(10, 20))

`RateLimitMiddleware` limits every HTTP request; `limit_route` one endpoint. Both take the
options of `redis_rl.http.Policy`; a key or cost function and `skip` get the ASGI scope, and
`on_limited(scope, decision, headers)` returns an ASGI app (a Starlette `Response` is one).
The limiter's failure policy, deny cache and Lua fallback apply to each request unchanged.
"""

import functools

from .http import PROBLEM_TYPE, Policy

__all__ = ["RateLimitMiddleware", "limit_route", "Policy"]


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
    """The decision and header fields for one request, or None when `skip` lets it pass."""
    if policy.skip is not None and policy.skip(scope):
        return None
    key = policy.key_for(scope, _peer(scope), _header_reader(scope))
    decision = await policy.limiter.acquire(key, policy.limit, policy.cost_for(scope))
    return decision, policy.headers(decision)


async def _send_problem(send, decision, headers):
    body = Policy.problem(decision)
    raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    raw += [(b"content-type", PROBLEM_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 429, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class RateLimitMiddleware:
    """ASGI middleware: a 429 (application/problem+json, RFC 9457) for requests over the
    limit, the rate-limit header fields on every response it decided."""

    def __init__(self, app, limiter, limit, **options):
        self.app = app
        self.policy = Policy(limiter, limit, **options)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        decided = await decide(self.policy, scope)
        if decided is None:
            return await self.app(scope, receive, send)
        decision, headers = decided
        if not decision.allowed:
            if self.policy.on_limited is not None:
                response = self.policy.on_limited(scope, decision, headers)
                return await response(scope, receive, send)
            return await _send_problem(send, decision, headers)
        raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers") or ()) + raw)
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def limit_route(limiter, limit, **options):
    """A decorator for one Starlette or FastAPI endpoint that takes the request (a parameter
    named `request`, or the first argument). Over the limit it returns the 429 without
    running the endpoint; otherwise it adds the header fields to the Response the endpoint
    returns (an endpoint returning plain data gets none: return a Response, or use the
    middleware)."""
    policy = Policy(limiter, limit, **options)

    def wrap(endpoint):
        @functools.wraps(endpoint)
        async def limited(*args, **kwargs):
            from starlette.responses import Response

            request = kwargs.get("request", args[0] if args else None)
            decided = await decide(policy, request.scope)
            if decided is None:
                return await endpoint(*args, **kwargs)
            decision, headers = decided
            if not decision.allowed:
                if policy.on_limited is not None:
                    return policy.on_limited(request.scope, decision, headers)
                return Response(Policy.problem(decision), status_code=429, headers=dict(headers),
                                media_type=PROBLEM_TYPE)
            response = await endpoint(*args, **kwargs)
            if isinstance(response, Response):
                for name, value in headers:
                    response.headers[name] = value
            return response

        return limited

    return wrap
