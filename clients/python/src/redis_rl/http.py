"""What the HTTP middlewares share (`redis_rl.asgi`, `redis_rl.wsgi`): the policy (limit, key,
cost, trusted proxies, hooks), the client address behind trusted proxies, the response header
fields, and the 429 problem body. No framework is imported here.

Header fields written (each response the limiter decided):

- `RateLimit-Policy` and `RateLimit`, as draft-ietf-httpapi-ratelimit-headers-10 (September
  2025) defines them: `RateLimit-Policy: "default";q=<capacity>;w=<seconds to refill it>`
  and `RateLimit: "default";r=<remaining>;t=<seconds until full>`;
- `X-RateLimit-Limit`, `-Remaining`, `-Reset` (seconds until full), which existing clients
  read (on by default: `legacy_headers=False` turns them off);
- `Retry-After` (seconds, rounded up) on a 429 that a wait can cure.

When several limits decided one request (the middleware and a route decorator), one set of
fields is written: `RateLimit-Policy` and `RateLimit` as the draft's lists, one item per
limit, and `X-RateLimit-*` of the tightest (the fewest tokens left). A decision by the
"open" failure policy knows no quota, so it writes none of these fields; one by "closed"
knows the configured limit but not what is left, so it writes `RateLimit-Policy`,
`X-RateLimit-Limit` and `Retry-After` only.
"""

import asyncio
import inspect
import ipaddress
import json
import math
import threading

from ._core import Limit
from .lease import check_limit, check_ttl

#: The start of every default key space: `rl:http:<rate>:<capacity>:` (see `Policy`).
DEFAULT_PREFIX = "rl:http:"

#: The draft whose `RateLimit-Policy` and `RateLimit` syntax is written.
HEADERS_DRAFT = "draft-ietf-httpapi-ratelimit-headers-10"


_UNSET = object()


async def _awaited(awaitable):
    return await awaitable


def run_awaitable(value):
    """`value`, or, when it is awaitable (an `async def` hook's coroutine), its result, for
    the sync middlewares (WSGI, Django): a coroutine is true, so a hook's awaitable used as its
    value would let every request skip the limit. Django's (asgiref's) `async_to_sync` runs it
    when installed (on the server's event loop under ASGI); otherwise a private event loop
    does, in this thread or, when this thread already runs a loop, in a new one."""
    if not inspect.isawaitable(value):
        return value
    try:
        from asgiref.sync import async_to_sync
    except ImportError:
        async_to_sync = None
    if async_to_sync is not None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop here: the case asgiref serves
            return async_to_sync(_awaited)(value)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(value))
    # This thread runs a loop that is blocked in this call: run the awaitable in another.
    result = {}

    def run():
        try:
            result["value"] = asyncio.run(_awaited(value))
        except BaseException as error:  # re-raised in the caller's thread
            result["error"] = error

    worker = threading.Thread(target=run, name="redis-rl-hook")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def call_hook(hook, *args):
    """A hook's value in a sync middleware: called, and run to completion when awaitable."""
    return run_awaitable(hook(*args))


def _networks(trusted_proxies):
    return tuple(ipaddress.ip_network(p, strict=False) for p in trusted_proxies)


def _address(text):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


class Policy:
    """One limit for HTTP requests.

    - `limiter`: a `redis_rl.Limiter` (WSGI) or `redis_rl.asyncio.Limiter` (ASGI);
    - `limit`: the `Limit` each key gets, or a function of the request returning one (a
      user's plan);
    - `key`: "ip" (the client address, default), "header:<Name>" (a request header's value;
      requests without it fall back to the address), or a function of the request (the ASGI
      scope, the WSGI environ) returning the key;
    - `cost`: tokens per request, or a function of the request;

    Every function here (`limit`, `key`, `cost`, `skip`, `on_limited`) may be `async def`
    or return an awaitable: the ASGI middleware and Django's decorator on an async view await
    it; the sync ones (WSGI, Django's middleware and sync views) run it to completion
    (`run_awaitable`), never using the awaitable itself as the value.
    - `trusted_proxies`: addresses or networks ("10.0.0.0/8") whose X-Forwarded-For is
      believed; from anyone else it is ignored (default: nobody);
    - `prefix`: put before each key in Redis. By default each limit has its own key space,
      `rl:http:<rate>:<capacity>:` (`rl:http:100/60:100:ip:203.0.113.7`), so a middleware and
      a route decorator with different limits never share a bucket. Two policies that still
      name the same Redis key for one request (the same limit, or the same `prefix`) are
      refused with a ValueError naming the key: give each its own `prefix`;
    - `policy_name`: the name in the RateLimit fields (default "default");
    - `legacy_headers`: also write X-RateLimit-* (default True);
    - `skip`: a function of the request; True lets the request through untouched (health
      checks);
    - `on_limited`: a function (request, decision, headers) returning the response to send
      instead of the problem+json 429 (a framework response, see asgi/wsgi).
    """

    def __init__(self, limiter, limit, *, key="ip", cost=1, trusted_proxies=(), prefix=None,
                 policy_name="default", legacy_headers=True, skip=None, on_limited=None):
        if not (key == "ip" or callable(key) or (isinstance(key, str) and key.startswith("header:"))):
            raise ValueError('key must be "ip", "header:<Name>" or a function of the request')
        self.limiter = limiter
        self.limit = limit
        self.key = key
        self.cost = cost
        self.trusted = _networks(trusted_proxies)
        self.prefix = prefix
        self.policy_name = policy_name
        self.legacy_headers = legacy_headers
        self.skip = skip
        self.on_limited = on_limited

    # The key -------------------------------------------------------------------------------

    def client_address(self, peer, forwarded_for):
        """The client's address: the peer, or, when the peer is a trusted proxy, the nearest
        address in X-Forwarded-For that is not one (read from the right, where the trusted
        proxies appended; anything further left may be forged)."""
        peer_ip = _address(peer or "")
        if peer_ip is None or not self._trusted(peer_ip) or not forwarded_for:
            return peer or "unknown"
        hops = [h for h in (x.strip() for x in forwarded_for.split(",")) if h]
        for hop in reversed(hops):
            ip = _address(hop)
            if ip is None:
                return peer
            if not self._trusted(ip):
                return str(ip)
        return str(_address(hops[0])) if hops else peer

    def _trusted(self, ip):
        return any(ip in net for net in self.trusted)

    def prefix_for(self, limit):
        """What goes before the key in Redis: `prefix`, or the limit's own key space."""
        if not isinstance(limit, Limit):
            raise TypeError(f"limit must be (or give) a redis_rl.Limit, got {type(limit).__name__}")
        if self.prefix is not None:
            return self.prefix
        rate, capacity = limit.args()
        return f"{DEFAULT_PREFIX}{rate}:{capacity}:"

    def claim(self, claims, key):
        """Records that this policy uses the Redis `key` for the request whose claims (a dict
        kept with the request) are given; ValueError if another policy already does, as the two
        would each count the other's requests in one bucket."""
        owner = claims.setdefault(key, self)
        if owner is not self:
            raise ValueError(f"two rate limits use the Redis key {key!r} for one request, so each "
                             "would count the other's requests; give each its own prefix")

    def key_for(self, request, peer, header, computed=_UNSET, limit=None):
        """The bucket key in Redis, in the key space of `limit` unless a prefix was given:
        `header(name)` reads a request header (None when absent); `computed`, what the key
        function returned when the caller called it (and awaited)."""
        return self.prefix_for(limit) + self.key_suffix(request, peer, header, computed)

    def key_suffix(self, request, peer, header, computed=_UNSET):
        """The request's key without the prefix: the key function's value, "h:<header value>"
        or "ip:<client address>"."""
        if callable(self.key):
            key = self.key(request) if computed is _UNSET else computed
        elif self.key.startswith("header:"):
            key = header(self.key[len("header:"):]) or None
            if key is not None:
                key = "h:" + key
        else:
            key = None
        if key is None:
            key = "ip:" + self.client_address(peer, header("X-Forwarded-For"))
        return str(key)

    def cost_for(self, request):
        return self.cost(request) if callable(self.cost) else self.cost

    def limit_for(self, request):
        return self.limit(request) if callable(self.limit) else self.limit

    # The response ---------------------------------------------------------------------------

    def headers(self, decision):
        """The header fields for `decision` alone, as [(name, value)]."""
        return header_fields([(self, decision)])

    def policy_item(self, limit):
        # w: the seconds a refill from empty takes, exact, rounded up.
        window_s = max(1, math.ceil(limit.capacity_fraction / limit.rate_fraction))
        return f'"{self.policy_name}";q={math.floor(limit.capacity_fraction)};w={window_s}'

    def remaining_item(self, decision):
        return f'"{self.policy_name}";r={decision.remaining};t={_ceil_s(decision.reset_after_ms)}'

    @staticmethod
    def problem(decision):
        """The RFC 9457 problem details body of a 429, as bytes."""
        if decision.retry_after_ms < 0:
            detail = "This request costs more than the rate limit's capacity; it can never be allowed."
        else:
            detail = f"Rate limit exceeded; retry after {-(-decision.retry_after_ms // 1000)} s."
        body = {"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": detail}
        return json.dumps(body).encode()


PROBLEM_TYPE = "application/problem+json"


class InFlight:
    """An in-flight limit per key, the middlewares' `in_flight` option: at most `limit`
    requests of one key (the policy's key: the client address, a header, a function) run at
    once. Each request takes a lease (RL.LEASE) of `ttl_ms` before the app runs and releases
    it when the response is done (the last body chunk sent, the client gone, an exception; for
    WSGI when the server closes the response iterable); while it runs the lease is renewed
    every ttl_ms / 2 (`renew=False` does not), and a process that dies holding it frees the
    slot when `ttl_ms` runs out. Over the limit the request gets a 429 with Retry-After (the
    earliest a slot frees). Keys live under `prefix`, by default `rl:http:inflight:<limit>:`
    (or the policy's `prefix` followed by `inflight:`).

    The option takes an InFlight, a limit (an int; ttl_ms 60 s) or a `(limit, ttl_ms)` pair.
    """

    __slots__ = ("limit", "ttl_ms", "renew", "prefix")

    def __init__(self, limit, ttl_ms=60_000, *, renew=True, prefix=None):
        self.limit = check_limit(limit)
        self.ttl_ms = check_ttl(ttl_ms)
        self.renew = bool(renew)
        self.prefix = prefix

    @classmethod
    def of(cls, value):
        """The option's value as an InFlight (None stays None)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, tuple):
            return cls(*value)
        return cls(value)

    def key(self, policy, suffix):
        if self.prefix is not None:
            return self.prefix + suffix
        if policy.prefix is not None:
            return policy.prefix + "inflight:" + suffix
        return f"{DEFAULT_PREFIX}inflight:{self.limit}:{suffix}"

    @staticmethod
    def headers(decided, lease):
        """The fields of a 429 for a request over its in-flight limit: the rate limit's own
        (when one decided it) and Retry-After, until a slot frees."""
        fields = [(n, v) for n, v in header_fields(decided) if n != "Retry-After"]
        return fields + [("Retry-After", str(_ceil_s(lease.retry_after_ms)))]

    @staticmethod
    def problem(lease):
        """The RFC 9457 problem details body of the 429, as bytes."""
        detail = (f"Too many requests in flight (at most {lease.limit}); retry after "
                  f"{_ceil_s(lease.retry_after_ms)} s.")
        body = {"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": detail}
        return json.dumps(body).encode()

#: The names `header_fields` writes, which a middleware replaces in a response it decided.
FIELD_NAMES = ("ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining",
               "x-ratelimit-reset", "retry-after")


def _ceil_s(ms):
    return -(-ms // 1000)


def header_fields(decided):
    """One set of header fields for the [(policy, decision)] of one request, as [(name,
    value)]: each limit an item of RateLimit-Policy (unless "open" decided it) and of
    RateLimit (unless a failure policy other than "local" did: no quota is known), X-RateLimit-*
    of the tightest limit whose quota is known (X-RateLimit-Limit alone when only "closed"
    decided), and Retry-After, the longest wait among the denials a wait can cure."""
    decided = [(p, d) for p, d in decided if d.source != "open"]
    known = [(p, d) for p, d in decided if d.source != "closed"]
    out = []
    if decided:
        out.append(("RateLimit-Policy", ", ".join(p.policy_item(d.limit) for p, d in decided)))
    if known:
        out.append(("RateLimit", ", ".join(p.remaining_item(d) for p, d in known)))
    if any(p.legacy_headers for p, _ in decided):
        if known:
            _, tight = min(known, key=lambda e: (e[1].remaining, -e[1].reset_after_ms))
            legacy = tight.headers()
            for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"):
                out.append((name, legacy[name]))
        else:
            out.append(("X-RateLimit-Limit", decided[0][1].limit.args()[1]))
    waits = [d.retry_after_ms for _, d in decided if not d.allowed and d.retry_after_ms >= 0]
    if waits:
        out.append(("Retry-After", str(_ceil_s(max(waits)))))
    return out
