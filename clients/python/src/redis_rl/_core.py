"""What the sync and asyncio limiters share: the types, the failure policy and the shield.

Nothing here does I/O. `Engine` holds a limiter's state (which path reaches Redis, the outage,
the counters, the deny cache, the local buckets) behind one lock; `redis_rl.client` and
`redis_rl.asyncio` only send the commands it builds and hand it what came back.
"""

import logging
import math
import threading
import time
from collections import OrderedDict
from fractions import Fraction
from importlib import resources

from .bucket import LocalBuckets

log = logging.getLogger("redis_rl")

# The module's accepted ranges (README, RL.ACQUIRE).
MIN_RATE, MAX_RATE = 1e-6, 1e9
MAX_CAPACITY = 1e15
MAX_REFILL_S = 3_153_600_000.0

POLICIES = ("open", "closed", "local")
WITHOUT_MODULE = ("lua", "refuse")
SOURCES = ("redis", "cache", "local", "open", "closed", "lua")

#: What a `closed` decision tells the caller to wait, in ms (it cannot know better).
CLOSED_RETRY_AFTER_MS = 1000

# Denominators of the script's fixed-point pairs must stay below 2^31 (clients/lua/rl.lua).
_MAX_EXACT_DENOMINATOR = 2**31
_ROUNDED_DENOMINATOR = 2**30


class Error(Exception):
    """Base of this package's own errors."""


class ModuleMissingError(Error):
    """The server has no RL.ACQUIRE and the limiter was built with without_module="refuse"."""


def _number(value):
    """A double as the module parses it back to the same double."""
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class Limit:
    """A validated limit: `rate` tokens per second, a burst of `capacity` tokens.

    Raises ValueError (naming the argument, with the module's range) when the module would
    refuse it, so a bad limit fails where it is written rather than on every request.
    """

    __slots__ = ("rate", "capacity", "rate_fraction", "capacity_fraction", "_script")

    def __init__(self, rate, capacity):
        rate, capacity = _finite(rate, "rate"), _finite(capacity, "capacity")
        if not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError("rate must be a number from 0.000001 to 1000000000 (tokens per second)")
        if not 0 < capacity <= MAX_CAPACITY:
            raise ValueError("capacity must be a number above 0 and at most 1e15 (tokens)")
        if capacity / rate > MAX_REFILL_S:
            raise ValueError("capacity / rate must be at most 3153600000 (a full refill within 100 years)")
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "rate_fraction", Fraction(rate))
        object.__setattr__(self, "capacity_fraction", Fraction(capacity))
        object.__setattr__(self, "_script", None)

    def __setattr__(self, name, value):
        raise AttributeError("Limit is immutable")

    def __eq__(self, other):
        return isinstance(other, Limit) and (self.rate, self.capacity) == (other.rate, other.capacity)

    def __hash__(self):
        return hash((self.rate, self.capacity))

    def __repr__(self):
        return f"Limit(rate={_number(self.rate)}, capacity={_number(self.capacity)})"

    def args(self):
        """`rate capacity` as the module's arguments."""
        return [_number(self.rate), _number(self.capacity)]

    def script_args(self, cost, refund=False):
        """The 10 numbers the Lua script takes for this limit and cost (clients/lua/rl.lua)."""
        if self._script is None:
            t_us = Fraction(10**6) / self.rate_fraction
            if t_us.denominator < _MAX_EXACT_DENOMINATOR:
                d = t_us.denominator
            else:  # not representable: round T up, so the script is only ever stricter
                d = _ROUNDED_DENOMINATOR
                t_us = Fraction(math.ceil(t_us * d), d)
            object.__setattr__(self, "_script", (d, t_us))
        d, t_us = self._script
        cap = self.capacity_fraction
        cost = Fraction(cost)
        tq, tr = divmod(math.ceil(t_us * d), d)
        cq, cr = divmod(math.floor(cap * t_us * d), d)
        if cost > cap:
            sq, sr = -1, 0
        else:
            sq, sr = divmod(math.floor((cap - cost) * t_us * d), d)
        rounding = math.floor if refund else math.ceil
        kq, kr = divmod(rounding(cost * t_us * d), d)
        return [str(x) for x in (d, tq, tr, cq, cr, sq, sr, kq, kr, math.floor(cap))]


def _finite(value, name):
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        if name == "cost":
            raise ValueError("cost must be a finite number >= 0 (tokens)")
        raise ValueError(f"{name} must be a finite number")
    return number


def check_cost(cost):
    cost = _finite(cost, "cost")
    if cost < 0:
        raise ValueError("cost must be a finite number >= 0 (tokens)")
    return cost


def _ceil_s(ms):
    return -(-ms // 1000)


class Decision:
    """Who decided what for one call.

    `allowed`, `remaining` (whole tokens left), `retry_after_ms` (0 when allowed, -1 when the
    cost exceeds the capacity and no wait helps), `reset_after_ms` (until full), the `limit`
    asked for, and `source`: "redis" (the module), "lua" (the fallback script), "cache" (the
    deny cache), or the failure policy that decided without Redis: "local", "open", "closed".
    """

    __slots__ = ("allowed", "remaining", "retry_after_ms", "reset_after_ms", "limit", "source")

    def __init__(self, allowed, remaining, retry_after_ms, reset_after_ms, limit, source):
        self.allowed = bool(allowed)
        self.remaining = int(remaining)
        self.retry_after_ms = int(retry_after_ms)
        self.reset_after_ms = int(reset_after_ms)
        self.limit = limit
        self.source = source

    def __bool__(self):
        return self.allowed

    def __repr__(self):
        return (f"Decision(allowed={self.allowed}, remaining={self.remaining}, "
                f"retry_after_ms={self.retry_after_ms}, reset_after_ms={self.reset_after_ms}, "
                f"limit={self.limit!r}, source={self.source!r})")

    def headers(self):
        """X-RateLimit-Limit, -Remaining, -Reset (seconds, rounded up), and Retry-After
        (seconds, rounded up) when denied and a wait can help."""
        headers = {
            "X-RateLimit-Limit": _number(self.limit.capacity),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(_ceil_s(self.reset_after_ms)),
        }
        if not self.allowed and self.retry_after_ms >= 0:
            headers["Retry-After"] = str(_ceil_s(self.retry_after_ms))
        return headers


class MultiDecision:
    """The answer of `acquire_all`: all or nothing.

    `allowed`, `refused_index` (the first refusing item, -1 when allowed), `retry_after_ms`
    (the longest wait among the refusing items, -1 if one can never succeed), `decisions`
    (one Decision per item, as RL.ACQUIRE.MULTI replies; empty when `source` is "cache",
    which knows only the refusing item) and `source`.
    """

    __slots__ = ("allowed", "refused_index", "retry_after_ms", "decisions", "source")

    def __init__(self, allowed, refused_index, retry_after_ms, decisions, source):
        self.allowed = bool(allowed)
        self.refused_index = int(refused_index)
        self.retry_after_ms = int(retry_after_ms)
        self.decisions = tuple(decisions)
        self.source = source

    def __bool__(self):
        return self.allowed

    def __repr__(self):
        return (f"MultiDecision(allowed={self.allowed}, refused_index={self.refused_index}, "
                f"retry_after_ms={self.retry_after_ms}, decisions={list(self.decisions)!r}, "
                f"source={self.source!r})")


class Refund:
    """The answer of `refund`: `remaining` and `reset_after_ms` after it, and `source`."""

    __slots__ = ("remaining", "reset_after_ms", "source")

    def __init__(self, remaining, reset_after_ms, source):
        self.remaining = int(remaining)
        self.reset_after_ms = int(reset_after_ms)
        self.source = source

    def __repr__(self):
        return f"Refund(remaining={self.remaining}, reset_after_ms={self.reset_after_ms}, source={self.source!r})"


def script_text():
    return resources.files(__package__).joinpath("rl.lua").read_text()


def is_unavailable(error):
    """Whether an error means Redis cannot decide now (the failure policy applies): connection
    errors, timeouts, and the OOM, READONLY, LOADING (and cluster-down) error replies."""
    from redis import exceptions as e

    import asyncio

    if isinstance(error, (e.ConnectionError, e.TimeoutError, OSError, TimeoutError, asyncio.TimeoutError)):
        return True  # BusyLoadingError (LOADING) is a ConnectionError
    for name in ("ReadOnlyError", "OutOfMemoryError", "ClusterDownError", "MasterDownError",
                 "TryAgainError", "ClusterError"):
        kind = getattr(e, name, None)
        if kind is not None and isinstance(error, kind):
            return True
    if type(error).__name__ == "RedisClusterException" and "cannot be connected" in str(error):
        return True  # a cluster client that could reach none of its startup nodes
    if isinstance(error, e.ResponseError):
        text = str(error)
        return text.startswith(("OOM", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"))
    return False


def is_unknown_command(error):
    from redis import exceptions as e

    return isinstance(error, e.ResponseError) and "unknown command" in str(error).lower()


def is_noscript(error):
    from redis import exceptions as e

    return isinstance(error, e.NoScriptError) or (
        isinstance(error, e.ResponseError) and str(error).startswith("NOSCRIPT"))


class Engine:
    """One limiter's state and rules; see `redis_rl.Limiter` for the meaning of each option."""

    def __init__(self, on_error, instances, deny_cache, without_module, timeout_ms,
                 probe_interval_ms, local_max_keys, clock):
        if on_error not in POLICIES:
            raise ValueError('on_error must be "open", "closed" or "local" (there is no default: '
                             'choose per limit, see the README "Clients")')
        if without_module not in WITHOUT_MODULE:
            raise ValueError('without_module must be "lua" or "refuse"')
        if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
            raise ValueError("instances must be an integer >= 1")
        if deny_cache is True:
            deny_cache = 10_000
        if deny_cache is False or deny_cache is None:
            deny_cache = 0
        if not isinstance(deny_cache, int) or deny_cache < 0:
            raise ValueError("deny_cache must be True, False or a size bound (entries)")
        if not (isinstance(timeout_ms, (int, float)) and 0 < timeout_ms <= 60_000):
            raise ValueError("timeout_ms must be above 0 and at most 60000")
        self.on_error = on_error
        self.without_module = without_module
        self.timeout_s = timeout_ms / 1000
        self.probe_interval_s = probe_interval_ms / 1000
        self.clock = clock
        self.lock = threading.Lock()
        self.local = LocalBuckets(instances, local_max_keys)
        self.cache_size = deny_cache
        self.cache = OrderedDict()  # key -> (limit, cost, until_s, remaining, reset_until_s)
        self.mode = None  # None: not detected yet; "module", "lua" or "missing"
        self.sha = None
        self.script = script_text()
        self.counters = dict.fromkeys(SOURCES, 0)
        self.counters["outages"] = 0
        self.down_since = None
        self.next_probe = 0.0
        self.without_redis = 0  # decisions in the current outage

    # The shield -----------------------------------------------------------------------------

    def cached(self, key, limit, cost):
        """A denial from the deny cache, or None. Caller holds no lock."""
        if not self.cache_size:
            return None
        now = self.clock()
        with self.lock:
            entry = self.cache.get(key)
            if entry is None:
                return None
            cached_limit, cached_cost, until, remaining, reset_until = entry
            if now >= until:
                del self.cache[key]
                return None
            if cached_limit != limit or cost < cached_cost:
                return None
            self.cache.move_to_end(key)
            self.counters["cache"] += 1
        return Decision(False, remaining, math.ceil((until - now) * 1000),
                        max(0, math.ceil((reset_until - now) * 1000)), limit, "cache")

    def remember(self, key, limit, cost, decision, sent_at):
        """After a denial by Redis: deny (key, >= cost) locally until retry_after has passed,
        counted from when the request was sent (the server decided after that)."""
        if not self.cache_size or decision.allowed or decision.retry_after_ms <= 0:
            return
        with self.lock:
            self.cache[key] = (limit, cost, sent_at + decision.retry_after_ms / 1000,
                               decision.remaining, sent_at + decision.reset_after_ms / 1000)
            self.cache.move_to_end(key)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)

    def forget(self, key):
        if self.cache_size:
            with self.lock:
                self.cache.pop(key, None)

    # The failure policy ---------------------------------------------------------------------

    def skip_redis(self):
        """During an outage, Redis is tried again only every probe_interval_ms."""
        with self.lock:
            if self.down_since is None:
                return False
            now = self.clock()
            if now >= self.next_probe:
                self.next_probe = now + self.probe_interval_s
                return False
            return True

    def answered(self, source):
        with self.lock:
            self.counters[source] += 1
            if self.down_since is not None:
                log.warning("redis-rl: Redis answers again after %.1f s; %d decisions were taken "
                            "without it (on_error=%r)", self.clock() - self.down_since,
                            self.without_redis, self.on_error)
                self.down_since = None
                self.without_redis = 0

    def failed(self, error):
        """Records a call Redis could not answer; logs once per outage."""
        with self.lock:
            if self.down_since is None:
                self.down_since = self.clock()
                self.next_probe = self.down_since + self.probe_interval_s
                self.counters["outages"] += 1
                log.warning("redis-rl: Redis cannot decide (%s: %s); deciding with on_error=%r "
                            "until it answers", type(error).__name__, error, self.on_error)

    def _count_policy(self):
        self.counters[self.on_error] += 1
        self.without_redis += 1

    def policy_acquire(self, key, limit, cost, take=True):
        with self.lock:
            self._count_policy()
            if self.on_error == "open":
                return Decision(True, 0, 0, 0, limit, "open")
            if self.on_error == "closed":
                return Decision(False, 0, CLOSED_RETRY_AFTER_MS, 0, limit, "closed")
            reply = self.local.acquire(key, limit, cost, self.now_us(), take)
        return Decision(*reply, limit, "local")

    def policy_acquire_all(self, items):
        with self.lock:
            self._count_policy()
            if self.on_error == "local":
                allowed, refused, retry, replies = self.local.acquire_all(items, self.now_us())
                return MultiDecision(allowed, refused, retry, [
                    Decision(*r, limit, "local") for r, (_, limit, _) in zip(replies, items)], "local")
        if self.on_error == "open":
            return MultiDecision(True, -1, 0, [Decision(True, 0, 0, 0, lim, "open") for _, lim, _ in items],
                                 "open")
        return MultiDecision(False, 0, CLOSED_RETRY_AFTER_MS, [
            Decision(False, 0, CLOSED_RETRY_AFTER_MS, 0, lim, "closed") for _, lim, _ in items], "closed")

    def policy_refund(self, key, limit, cost):
        with self.lock:
            self._count_policy()
            if self.on_error != "local":
                return Refund(0, 0, self.on_error)
            remaining, reset_after_ms = self.local.refund(key, limit, cost, self.now_us())
        return Refund(remaining, reset_after_ms, "local")

    def now_us(self):
        return int(self.clock() * 1_000_000)

    # Building commands and reading replies --------------------------------------------------

    def command(self, op, items):
        """The module command, or the script's EVALSHA arguments after the sha, for op in
        acquire, peek, refund, multi over [(key, limit, cost)]."""
        if self.mode == "module":
            if op == "multi":
                args = ["RL.ACQUIRE.MULTI"]
                for key, limit, cost in items:
                    args += [key, *limit.args(), _number(cost)]
                return args
            (key, limit, cost), = items
            table = getattr(key, "table", None)
            if table is not None:  # a bucket table's field (redis_rl.table.TableField)
                return [{"acquire": "RL.HACQUIRE", "peek": "RL.HPEEK", "refund": "RL.HREFUND"}[op],
                        table, key.field, *limit.args(), _number(cost)]
            return [{"acquire": "RL.ACQUIRE", "peek": "RL.PEEK", "refund": "RL.REFUND"}[op],
                    key, *limit.args(), _number(cost)]
        args = [str(len(items)), *(key for key, _, _ in items), op]
        for _, limit, cost in items:
            args += limit.script_args(cost, refund=(op == "refund"))
        return args

    def source(self):
        return "redis" if self.mode == "module" else "lua"

    def detected(self, command_info_reply):
        """Reads COMMAND INFO RL.ACQUIRE (a list holding None when there is no such command)."""
        present = bool(command_info_reply) and any(x for x in _flatten_first(command_info_reply))
        self.mode = "module" if present else ("lua" if self.without_module == "lua" else "missing")
        log.info("redis-rl: %s", "module found" if present else
                 f"no RL.ACQUIRE on the server; without_module={self.without_module!r}")

    def refuse_if_missing(self):
        if self.mode == "missing":
            raise ModuleMissingError(
                "the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this limiter "
                'was built with without_module="refuse"; load the module or use without_module="lua"')


def _flatten_first(reply):
    # redis-py may parse COMMAND INFO into a dict ({name: info}) or leave a list ([None]).
    if isinstance(reply, dict):
        return list(reply.values())
    return list(reply)


def monotonic():
    return time.monotonic()
