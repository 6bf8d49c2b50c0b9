"""Rate limits for Django on the sync `redis_rl.Limiter`: a middleware and a view decorator.

    # settings.py
    REDIS_RL_MIDDLEWARE = {"limiter": limiter, "limit": Limit(10, 20), "skip": is_health}
    MIDDLEWARE = [..., "redis_rl.django.RateLimitMiddleware", ...]

    # views.py
    @limit_view(limiter, Limit(1, 5), key=lambda request: request.user.pk)
    def search(request): ...

Both take the options of `redis_rl.http.Policy`; a limit, key or cost function and `skip`
get Django's `HttpRequest`, and `on_limited(request, decision, headers)` returns an
`HttpResponse`. Over the limit the answer is the problem+json 429 (RFC 9457). For a
class-based view, decorate `dispatch` with `django.utils.decorators.method_decorator`.

Sync and async: the middleware is sync (Django adapts it under ASGI) and takes the sync
`redis_rl.Limiter`. `limit_view` on a sync view takes the sync limiter; on an `async def` view
it takes `redis_rl.asyncio.Limiter` and the decorated view is async too. Any other pairing is
refused where the decorator is applied (TypeError). Every hook may be `async def`: a sync
path runs it to completion (`redis_rl.http.run_awaitable`, asgiref's `async_to_sync`), the
async path awaits it.

`"in_flight"` in REDIS_RL_MIDDLEWARE (a `redis_rl.http.InFlight`, a limit, or `(limit,
ttl_ms)`; "limit" may then be left out) adds an in-flight limit per key: a lease taken before
the view and released when Django closes the response, after its last chunk is sent.

Each decision is recorded on the request, so a request limited by the middleware and a view
decorator gets one set of header fields for both (`redis_rl.http.header_fields`).
"""

import functools
import inspect
from typing import Any, Callable

from .http import FIELD_NAMES, PROBLEM_TYPE, InFlight, Policy, call_hook, header_fields
from .hold import Held

__all__ = ["RateLimitMiddleware", "limit_view", "Policy"]

_DECIDED = "_redis_rl_decided"  # the request's list of (policy, decision)
_KEYS = "_redis_rl_keys"  # the request's Redis keys used so far, and by which policy


def _request_list(request, name, empty):
    value = getattr(request, name, None)
    if value is None:
        value = empty
        setattr(request, name, value)
    return value


def _key(policy, request, computed, limit):
    key = policy.key_for(request, request.META.get("REMOTE_ADDR"), request.headers.get, computed, limit)
    policy.claim(_request_list(request, _KEYS, {}), key)
    return key


def _record(policy, request, decision):
    decided = _request_list(request, _DECIDED, [])
    decided.append((policy, decision))
    return decision, header_fields(decided)


def decide(policy, request):
    """The decision and header fields for one request, or None when `skip` lets it pass.
    Each hook may be `async def`: it is run to completion (a coroutine is true: as `skip`'s
    value it would let every request through unlimited)."""
    if policy.skip is not None and call_hook(policy.skip, request):
        return None
    computed = call_hook(policy.key, request) if callable(policy.key) else None
    limit = call_hook(policy.limit_for, request)
    key = _key(policy, request, computed, limit)
    return _record(policy, request, policy.limiter.acquire(key, limit, call_hook(policy.cost_for, request)))


async def _value(hook, *args):
    value = hook(*args)
    if inspect.isawaitable(value):
        value = await value
    return value


async def decide_async(policy, request):
    """`decide` for an async view, on `redis_rl.asyncio.Limiter`, each hook awaited."""
    if policy.skip is not None and await _value(policy.skip, request):
        return None
    computed = await _value(policy.key, request) if callable(policy.key) else None
    limit = await _value(policy.limit_for, request)
    key = _key(policy, request, computed, limit)
    cost = await _value(policy.cost_for, request)
    return _record(policy, request, await policy.limiter.acquire(key, limit, cost))


def _problem(decision, headers):
    from django.http import HttpResponse

    response = HttpResponse(Policy.problem(decision), status=429, content_type=PROBLEM_TYPE)
    for name, value in headers:
        response[name] = value
    return response


def _limited(policy, request, decision, headers):
    if policy.on_limited is not None:
        return call_hook(policy.on_limited, request, decision, headers)
    return _problem(decision, headers)


async def _limited_async(policy, request, decision, headers):
    if policy.on_limited is not None:
        return await _value(policy.on_limited, request, decision, headers)
    return _problem(decision, headers)


def _write_fields(request, response):
    """One set of fields for every limit that decided `request`, replacing any written."""
    decided = getattr(request, _DECIDED, None)
    if not decided:
        return response
    for name in FIELD_NAMES:
        if name in response:
            del response[name]
    for name, value in header_fields(decided):
        response[name] = value
    return response


class RateLimitMiddleware:
    """Django middleware over `settings.REDIS_RL_MIDDLEWARE`, a dict of `limiter`, `limit`
    and any option of `redis_rl.http.Policy`: a 429 for requests over the limit, the
    rate-limit header fields on every response it decided."""

    def __init__(self, get_response: Any) -> None:
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        options = dict(getattr(settings, "REDIS_RL_MIDDLEWARE", None) or {})
        in_flight = InFlight.of(options.pop("in_flight", None))
        try:
            limiter = options.pop("limiter")
            limit = options.pop("limit") if in_flight is None else options.pop("limit", None)
        except KeyError as missing:
            raise ImproperlyConfigured(f"REDIS_RL_MIDDLEWARE needs {missing}") from None
        if _is_async_limiter(limiter):
            raise ImproperlyConfigured("REDIS_RL_MIDDLEWARE's limiter must be the sync "
                                       "redis_rl.Limiter: this middleware is sync")
        self.get_response = get_response
        self.policy = Policy(limiter, limit, **options)
        self.in_flight = in_flight

    def __call__(self, request):
        policy = self.policy
        if policy.limit is not None:
            decided = decide(policy, request)
            if decided is None:
                return self.get_response(request)
            decision, headers = decided
            if not decision.allowed:
                return _limited(policy, request, decision, headers)
        elif policy.skip is not None and call_hook(policy.skip, request):
            return self.get_response(request)
        if self.in_flight is None:
            return _write_fields(request, self.get_response(request))
        return _write_fields(request, self._in_flight(request))

    def _in_flight(self, request):
        """The response under the in-flight limit: a lease taken first and released when
        Django closes the response (after its last chunk is sent, a streamed one included)."""
        policy, in_flight = self.policy, self.in_flight
        computed = call_hook(policy.key, request) if callable(policy.key) else None
        suffix = policy.key_suffix(request, request.META.get("REMOTE_ADDR"), request.headers.get, computed)
        lease = policy.limiter.lease(in_flight.key(policy, suffix), in_flight.limit, in_flight.ttl_ms)
        if not lease.allowed:
            headers = InFlight.headers(getattr(request, _DECIDED, None) or [], lease)
            if policy.on_limited is not None:
                return call_hook(policy.on_limited, request, lease, headers)
            from django.http import HttpResponse

            response = HttpResponse(InFlight.problem(lease), status=429, content_type=PROBLEM_TYPE)
            for name, value in headers:
                response[name] = value
            return response
        held = Held(policy.limiter, lease, in_flight.renew)
        try:
            response = self.get_response(request)
        except BaseException:
            held.close()
            raise
        response._resource_closers.append(held.close)
        return response


def limit_view(limiter: Any, limit: Any, **options: Any) -> Callable[[Any], Any]:
    """A decorator for one Django view (a function of the request, or a class-based view's
    `dispatch` through `method_decorator`). Over the limit the view does not run and the 429
    is returned; otherwise the header fields are added to its response."""
    policy = Policy(limiter, limit, **options)

    def wrap(view):
        if inspect.iscoroutinefunction(view):
            if not _is_async_limiter(limiter):
                raise TypeError(f"limit_view: {view.__qualname__} is an async view, so the limiter "
                                "must be redis_rl.asyncio.Limiter")

            @functools.wraps(view)
            async def limited_async(request, *args, **kwargs):
                decided = await decide_async(policy, request)
                if decided is None:
                    return await view(request, *args, **kwargs)
                decision, headers = decided
                if not decision.allowed:
                    return await _limited_async(policy, request, decision, headers)
                return _write_fields(request, await view(request, *args, **kwargs))

            return limited_async
        if _is_async_limiter(limiter):
            raise TypeError(f"limit_view: {view.__qualname__} is a sync view, so the limiter "
                            "must be the sync redis_rl.Limiter")

        @functools.wraps(view)
        def limited(request, *args, **kwargs):
            decided = decide(policy, request)
            if decided is None:
                return view(request, *args, **kwargs)
            decision, headers = decided
            if not decision.allowed:
                return _limited(policy, request, decision, headers)
            return _write_fields(request, view(request, *args, **kwargs))

        return limited

    return wrap


limit_route = limit_view  # the name the other middlewares use


def _is_async_limiter(limiter):
    return inspect.iscoroutinefunction(getattr(limiter, "acquire", None))
