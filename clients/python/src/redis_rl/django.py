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
Django's sync views are served; the limiter is the sync one.

Each decision is recorded on the request, so a request limited by the middleware and a view
decorator gets one set of header fields for both (`redis_rl.http.header_fields`).
"""

import functools

from .http import FIELD_NAMES, PROBLEM_TYPE, Policy, header_fields

__all__ = ["RateLimitMiddleware", "limit_view", "Policy"]

_DECIDED = "_redis_rl_decided"  # the request's list of (policy, decision)
_KEYS = "_redis_rl_keys"  # the request's Redis keys used so far, and by which policy


def decide(policy, request):
    """The decision and header fields for one request, or None when `skip` lets it pass."""
    if policy.skip is not None and policy.skip(request):
        return None
    limit = policy.limit_for(request)
    key = policy.key_for(request, request.META.get("REMOTE_ADDR"), request.headers.get, limit=limit)
    claims = getattr(request, _KEYS, None)
    if claims is None:
        claims = {}
        setattr(request, _KEYS, claims)
    policy.claim(claims, key)
    decision = policy.limiter.acquire(key, limit, policy.cost_for(request))
    decided = getattr(request, _DECIDED, None)
    if decided is None:
        decided = []
        setattr(request, _DECIDED, decided)
    decided.append((policy, decision))
    return decision, header_fields(decided)


def _limited(policy, request, decision, headers):
    if policy.on_limited is not None:
        return policy.on_limited(request, decision, headers)
    from django.http import HttpResponse

    response = HttpResponse(Policy.problem(decision), status=429, content_type=PROBLEM_TYPE)
    for name, value in headers:
        response[name] = value
    return response


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

    def __init__(self, get_response):
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        options = dict(getattr(settings, "REDIS_RL_MIDDLEWARE", None) or {})
        try:
            limiter, limit = options.pop("limiter"), options.pop("limit")
        except KeyError as missing:
            raise ImproperlyConfigured(f"REDIS_RL_MIDDLEWARE needs {missing}") from None
        self.get_response = get_response
        self.policy = Policy(limiter, limit, **options)

    def __call__(self, request):
        decided = decide(self.policy, request)
        if decided is None:
            return self.get_response(request)
        decision, headers = decided
        if not decision.allowed:
            return _limited(self.policy, request, decision, headers)
        return _write_fields(request, self.get_response(request))


def limit_view(limiter, limit, **options):
    """A decorator for one Django view (a function of the request, or a class-based view's
    `dispatch` through `method_decorator`). Over the limit the view does not run and the 429
    is returned; otherwise the header fields are added to its response."""
    policy = Policy(limiter, limit, **options)

    def wrap(view):
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
