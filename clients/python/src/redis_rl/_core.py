"""What the sync and asyncio limiters share: the types, the failure policy and the shield.

Nothing here does I/O. `Engine` holds a limiter's state (which path reaches Redis, the outage,
the counters, the deny cache, the local buckets) behind one lock; `redis_rl.client` and
`redis_rl.asyncio` only send the commands it builds and hand it what came back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
import threading
import time
from collections import OrderedDict
from fractions import Fraction
from importlib import resources
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

from . import _decimal
from .bucket import DebtTooLongError, LocalBuckets
from .lease import (LOCAL_PREFIX, OPEN_PREFIX, Lease, LeaseCount, LocalLeases, Reservation,
                    check_id, check_limit, check_ttl, is_policy_id, new_id, policy_id)

if TYPE_CHECKING:
    import datetime
    import decimal

#: A number as the caller writes it: an int, a float, a Decimal or a numeric str.
Number = Union[int, float, str, "decimal.Decimal"]
#: A period as `Limit(..., per=)` takes it: seconds, or a datetime.timedelta.
Period = Union[int, float, str, "decimal.Decimal", "datetime.timedelta"]
#: One bucket of an all-or-nothing call: (key, limit) or (key, limit, cost).
Item = Union[Tuple[str, "Limit"], Tuple[str, "Limit", Number]]

log = logging.getLogger("redis_rl")


def _load_ranges():
    # The one statement of the module's ranges and error texts (clients/vectors/ranges.json,
    # shipped in the package beside rl.lua).
    ranges = json.loads(resources.files(__package__).joinpath("ranges.json").read_text())
    return {name: ranges[name] for name in ("rate", "capacity", "refill", "cost")}


RANGES = _load_ranges()
MIN_RATE = Fraction(RANGES["rate"]["min"])
MAX_RATE = Fraction(RANGES["rate"]["max"])
MIN_CAPACITY_ABOVE = Fraction(RANGES["capacity"]["above"])
MAX_CAPACITY = Fraction(RANGES["capacity"]["max"])
MAX_REFILL_S = Fraction(RANGES["refill"]["max_s"])
MIN_COST = Fraction(RANGES["cost"]["min"])
#: The longest a charge may leave a bucket short of full, in ns (the refill bound, 100 years).
MAX_DEBT_NS = MAX_REFILL_S * 10**9

POLICIES = ("open", "closed", "local")
WITHOUT_MODULE = ("lua", "refuse")
SOURCES = ("redis", "functions", "lua", "cache", "local", "open", "closed")

#: What a `closed` decision tells the caller to wait, in ms (it cannot know better).
CLOSED_RETRY_AFTER_MS = 1000

# Denominators of the script's fixed-point pairs must stay below 2^31 (clients/lua/rl.lua).
_MAX_EXACT_DENOMINATOR = 2**31
_ROUNDED_DENOMINATOR = 2**30


class Error(Exception):
    """Base of this package's own errors."""


class MisconfiguredError(Error):
    """A mistake to fix, not an outage to ride out: a wrong password, a permission the user
    lacks (the message names the command and the ACL rule to add), a cluster client on a
    server that is not a cluster or a plain client on a cluster, a module missing under
    without_module="refuse". `check()` raises it; at run time the failure policy decides, and
    each is logged at error level and counted in `counters["misconfigured"]`."""


class ModuleMissingError(MisconfiguredError):
    """The server has no RL.ACQUIRE and the limiter was built with without_module="refuse"."""


def _number(value):
    """The text sent for a number: its shortest round-trip decimal (see `_decimal.text`)."""
    return _decimal.text(value)


def _argument(value, name):
    """`(text, exact value)` of a caller's number, or ValueError naming the argument."""
    try:
        text = _decimal.text(value)
    except (TypeError, ValueError):
        raise ValueError(RANGES[name]["error"] if name == "cost" else f"{name} must be a finite number") from None
    return text, Fraction(text)


class Limit:
    """A validated limit: `rate` tokens per second (or `rate` tokens per `per` seconds), a
    burst of `capacity` tokens.

    `Limit(5, 10)` is 5 tokens a second with a burst of 10; `Limit(100, per=60)` is 100 tokens
    a minute, sent to the module as `100/60`, with a burst of 100 (capacity defaults to the
    count when `per` is given). `per` is a number of seconds or a `datetime.timedelta`.
`Limit("100/60")` (the module's `N/S` text) is `Limit("100", per="60")`.
    Numbers mean their shortest decimal: `Limit(0.1, 1)` is one token per 10 s exactly.

    Raises ValueError (naming the argument, with the module's range) when the module would
    refuse it, so a bad limit fails where it is written rather than on every request.
    """

    __slots__ = ("rate", "capacity", "per", "rate_fraction", "capacity_fraction", "_rate_text",
                 "_capacity_text", "_script")

    def __init__(self, rate: Number, capacity: Optional[Number] = None, *,
                 per: Optional[Period] = None) -> None:
        if isinstance(rate, str) and "/" in rate:
            # The module's own `N/S` text ("100/60"): the same limit as Limit(N, per=S).
            if per is not None:
                raise ValueError('rate given as "N/S" text takes no per')
            count, _, per = rate.partition("/")
            try:
                period_ok = _decimal.parse(per) > 0
            except ValueError:
                period_ok = False
            if not period_ok:
                raise ValueError('rate must be a finite number, or "N/S" text with S a decimal above 0')
            rate = count
        rate_text, rate_fraction = _argument(rate, "rate")
        if per is not None:
            try:
                per_text = _decimal.seconds_text(per)
            except (TypeError, ValueError):
                raise ValueError("per must be a finite number of seconds above 0") from None
            per_seconds = Fraction(per_text)
            if per_seconds <= 0:
                raise ValueError("per must be a finite number of seconds above 0")
            if capacity is None:
                capacity = rate
            if rate_fraction > 0:
                rate_text = f"{rate_text}/{per_text}"
            rate_fraction /= per_seconds
        elif capacity is None:
            raise TypeError("Limit() needs a capacity unless per is given (then it is the count)")
        capacity_text, capacity_fraction = _argument(capacity, "capacity")
        if not MIN_RATE <= rate_fraction <= MAX_RATE:
            raise ValueError(RANGES["rate"]["error"])
        if not MIN_CAPACITY_ABOVE < capacity_fraction <= MAX_CAPACITY:
            raise ValueError(RANGES["capacity"]["error"])
        if capacity_fraction / rate_fraction > MAX_REFILL_S:
            raise ValueError(RANGES["refill"]["error"])
        for name, value in (("rate", float(rate_fraction)), ("capacity", float(capacity_fraction)),
                            ("per", per), ("rate_fraction", rate_fraction),
                            ("capacity_fraction", capacity_fraction), ("_rate_text", rate_text),
                            ("_capacity_text", capacity_text), ("_script", None)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Limit is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Limit) and (self.rate_fraction, self.capacity_fraction) == (
            other.rate_fraction, other.capacity_fraction)

    def __hash__(self) -> int:
        return hash((self.rate_fraction, self.capacity_fraction))

    def __repr__(self):
        if self.per is not None:
            count = self._rate_text.partition("/")[0]
            return f"Limit({count}, {self._capacity_text}, per={_decimal.seconds_text(self.per)})"
        return f"Limit(rate={self._rate_text}, capacity={self._capacity_text})"

    def args(self) -> list[str]:
        """`rate capacity` as the module's arguments ("0.1", "100/60", "1e-06" ...)."""
        return [self._rate_text, self._capacity_text]

    def script_args(self, cost: Number, refund: bool = False) -> list[str]:
        """The 10 numbers the Lua script takes for this limit and cost (clients/lua/rl.lua),
        from the exact values the module would use."""
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
        cost = _decimal.exact(cost)
        tq, tr = divmod(math.ceil(t_us * d), d)
        cq, cr = divmod(math.floor(cap * t_us * d), d)
        if cost > cap:
            sq, sr = -1, 0
        else:
            sq, sr = divmod(math.floor((cap - cost) * t_us * d), d)
        rounding = math.floor if refund else math.ceil
        kq, kr = divmod(rounding(cost * t_us * d), d)
        return [str(x) for x in (d, tq, tr, cq, cr, sq, sr, kq, kr, math.floor(cap))]

    def script_packed(self, cost: Number, refund: bool = False) -> bytes:
        """The same 10 numbers packed in one argument of 80 bytes, as the script and the
        Functions library (version 3 on) read them fastest: little-endian IEEE doubles, each an
        integer below 2^53, so exact."""
        return struct.pack("<10d", *(int(x) for x in self.script_args(cost, refund)))


def check_cost(cost: Number) -> Any:
    """A cost as the module takes it (a finite number >= 0), or ValueError."""
    _, exact = _argument(cost, "cost")
    if exact < MIN_COST:
        raise ValueError(RANGES["cost"]["error"])
    # An int stays exact however large; anything else (a numeric string, a Decimal) becomes
    # the float whose shortest decimal is what will be sent.
    return cost if isinstance(cost, (int, float)) else float(cost)


def _ceil_s(ms):
    return -(-ms // 1000)


class Decision:
    """Who decided what for one call.

    `allowed`, `remaining` (whole tokens left: never below 0 after a take; a peek's is the
    signed balance, negative while a `charge` keeps the bucket in debt), `retry_after_ms` (0 when allowed, -1 when the
    cost exceeds the capacity and no wait helps), `reset_after_ms` (until full), the `limit`
    asked for, and `source`: "redis" (the module), "functions" (the Functions library), "lua"
    (the fallback script), "cache" (the deny cache), or the failure policy that decided without
    Redis: "local", "open", "closed".
    """

    __slots__ = ("allowed", "remaining", "retry_after_ms", "reset_after_ms", "limit", "source")
    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    limit: Limit
    source: str

    def __init__(self, allowed: Any, remaining: Any, retry_after_ms: Any, reset_after_ms: Any,
                 limit: Limit, source: str) -> None:
        self.allowed = bool(allowed)
        self.remaining = int(remaining)
        self.retry_after_ms = int(retry_after_ms)
        self.reset_after_ms = int(reset_after_ms)
        self.limit = limit
        self.source = source

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (f"Decision(allowed={self.allowed}, remaining={self.remaining}, "
                f"retry_after_ms={self.retry_after_ms}, reset_after_ms={self.reset_after_ms}, "
                f"limit={self.limit!r}, source={self.source!r})")

    def headers(self) -> Dict[str, str]:
        """X-RateLimit-Limit, -Remaining, -Reset (seconds, rounded up), and Retry-After
        (seconds, rounded up) when denied and a wait can help. A decision of the "open" or
        "closed" failure policy knows the limit but not what is left: X-RateLimit-Limit (and
        Retry-After) only."""
        headers = {"X-RateLimit-Limit": self.limit.args()[1]}
        if self.source not in ("open", "closed"):
            headers["X-RateLimit-Remaining"] = str(max(0, self.remaining))  # a peek's may be < 0
            headers["X-RateLimit-Reset"] = str(_ceil_s(self.reset_after_ms))
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
    allowed: bool
    refused_index: int
    retry_after_ms: int
    decisions: Tuple[Decision, ...]
    source: str

    def __init__(self, allowed: Any, refused_index: Any, retry_after_ms: Any,
                 decisions: Sequence[Decision], source: str) -> None:
        self.allowed = bool(allowed)
        self.refused_index = int(refused_index)
        self.retry_after_ms = int(retry_after_ms)
        self.decisions = tuple(decisions)
        self.source = source

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (f"MultiDecision(allowed={self.allowed}, refused_index={self.refused_index}, "
                f"retry_after_ms={self.retry_after_ms}, decisions={list(self.decisions)!r}, "
                f"source={self.source!r})")


class Charge:
    """The answer of `charge`: a post-paid cost applied, perhaps into debt.

    `applied` (whether the cost was recorded: by Redis, or by the "local" policy's bucket; False
    only when the "open" or "closed" policy answered, which record nothing: that charge is
    logged and counted in `counters["unapplied_charges"]`, and is the caller's to send again),
    `remaining` (the signed balance in whole tokens, rounded toward -infinity: negative while
    in debt), `retry_after_ms` (the wait until the debt is repaid and a take can pass again,
    0 when not in debt), `reset_after_ms` (until full), the `limit`, and `source` as in
    Decision. `in_debt` is `remaining < 0`.
    """

    __slots__ = ("applied", "remaining", "retry_after_ms", "reset_after_ms", "limit", "source")
    applied: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    limit: Limit
    source: str

    def __init__(self, applied: Any, remaining: Any, retry_after_ms: Any, reset_after_ms: Any,
                 limit: Limit, source: str) -> None:
        self.applied = bool(applied)
        self.remaining = int(remaining)
        self.retry_after_ms = int(retry_after_ms)
        self.reset_after_ms = int(reset_after_ms)
        self.limit = limit
        self.source = source

    @property
    def in_debt(self) -> bool:
        return self.remaining < 0

    def __repr__(self):
        return (f"Charge(applied={self.applied}, remaining={self.remaining}, "
                f"retry_after_ms={self.retry_after_ms}, reset_after_ms={self.reset_after_ms}, "
                f"limit={self.limit!r}, source={self.source!r})")


def refused(error):
    """The error to raise for a reply Redis refused: the module's (or script's) refusal of a
    charge past the debt bound as DebtTooLongError (as the "local" policy raises it), any
    other as it is."""
    text = str(error)
    if text.startswith("ERR "):
        text = text[4:]
    if text.startswith("cost would leave the bucket in debt"):
        return DebtTooLongError(text)
    if "is not an open reservation" in text:
        return ReservationNotOpenError(text)
    return error


class ReservationNotOpenError(Error):
    """A settle of an id that is no open reservation of the key: settled already (a settle
    applies once), lapsed at its ttl (it stands as taken), or never made."""


class Refund:
    """The answer of `refund`: `remaining` and `reset_after_ms` after it, and `source`."""

    __slots__ = ("remaining", "reset_after_ms", "source")
    remaining: int
    reset_after_ms: int
    source: str

    def __init__(self, remaining: Any, reset_after_ms: Any, source: str) -> None:
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

    if isinstance(error, (Busy, e.ConnectionError, e.TimeoutError, OSError, TimeoutError, asyncio.TimeoutError)):
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


def is_busy(error):
    """Whether an error means the client is busy, not that Redis is down: no connection came
    free in the pool before the deadline (redis-py's MaxConnectionsError of a full
    ConnectionPool, "No connection available." of a BlockingConnectionPool), or the deadline
    passed while the call still queued for one (`Busy`)."""
    from redis import exceptions as e

    if isinstance(error, Busy):
        return True
    kind = getattr(e, "MaxConnectionsError", None)
    if kind is not None and isinstance(error, kind):
        return True
    return isinstance(error, e.ConnectionError) and str(error).startswith(
        ("Too many connections", "No connection available"))


class Busy(Exception):
    """The deadline passed before the call had a connection to send on."""


def is_unknown_command(error):
    from redis import exceptions as e

    return isinstance(error, e.ResponseError) and "unknown command" in str(error).lower()


def is_wrongtype(error):
    """Whether a reply is WRONGTYPE: the server's own, or the one a function or a script stops
    with, which Redis 7 suffixes ("... script: <sha1>, on @user_script:147.") and older
    servers wrap ("ERR Error running script ...: WRONGTYPE ...")."""
    from redis import exceptions as e

    return isinstance(error, e.ResponseError) and re.search(r"\bWRONGTYPE\b", str(error)) is not None


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
                             'choose per limit, see docs/clients.md)')
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
        self.local_leases = LocalLeases(instances, local_max_keys)
        # The "local" policy's open reservations: (key, id) -> (limit, estimate, expiry_us).
        self.local_reservations = OrderedDict()
        self.local_max_keys = local_max_keys
        self.reservation_type = Reservation  # the asyncio limiter's settles with an await
        self.cache_size = deny_cache
        self.cache = OrderedDict()  # key -> (limit, cost, until_s, remaining, reset_until_s)
        self.mode = None  # None: not found yet; "module", "functions" or "lua"
        self.script = script_text()
        self.sha = hashlib.sha1(self.script.encode("utf-8")).hexdigest()
        self.evalsha_denied = False  # NOPERM on EVALSHA: send EVAL at once
        self.cluster = False  # learnt by acquire_across_slots from a CROSSSLOT reply
        self.functions_version = None  # the Functions library's, once checked
        self.counters = dict.fromkeys(SOURCES, 0)
        self.counters["outages"] = 0
        self.counters["misconfigured"] = 0
        self.misconfigured_logged = {}  # cause -> when it was last logged
        self.counters["busy"] = 0
        self.counters["unapplied_charges"] = 0
        self.down_since = None
        self.next_probe = 0.0
        self.without_redis = 0  # decisions in the current outage
        self.busy_logged = None  # when "busy" was last logged

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

    def busy(self, error):
        """Records a call that found no connection before the deadline: the client is busy
        (a full pool under load), Redis is not down, so no outage starts and the next calls go
        to Redis as usual. Logged at most once a second."""
        with self.lock:
            self.counters["busy"] += 1
            now = self.clock()
            if self.busy_logged is None or now - self.busy_logged >= 1:
                self.busy_logged = now
                log.warning("redis-rl: busy, not down: no connection to Redis within the deadline "
                            "(timeout_ms=%d; %s: %s); deciding with on_error=%r (%d busy so far). "
                            "Raise the pool's max_connections or timeout_ms",
                            round(self.timeout_s * 1000), type(error).__name__, error,
                            self.on_error, self.counters["busy"])

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

    def policy_charge(self, key, limit, cost):
        with self.lock:
            self._count_policy()
            if self.on_error == "local":
                reply = self.local.charge(key, limit, cost, self.now_us(), MAX_DEBT_NS)
                return Charge(*reply, limit, "local")
            self.counters["unapplied_charges"] += 1
        # Usage already done that nothing recorded: say so every time, with what was lost.
        log.warning("redis-rl: a charge of %s on %r was not applied: Redis cannot decide and "
                    "on_error=%r keeps no buckets (send it again, or use on_error=\"local\")",
                    cost, key, self.on_error)
        return Charge(False, 0, 0, 0, limit, self.on_error)

    # Leases and reservations -----------------------------------------------------------------

    def begin_lease(self, op, key, params):
        """`begin` for a lease op (`LEASE_OPS`): `params` holds the checked arguments ("limit",
        "ttl_ms", "id", and for reservations "bucket", "estimate", "actual"). An id the failure
        policy made ("open:", "local:", or one the local table holds) is answered here, never
        sent to Redis. Returns `(answer, None)` or `(None, call)` as `begin` does."""
        if op in ("lease", "reserve") and params.get("id") is None:
            params["fallback_id"] = new_id()  # a script cannot draw an id itself
        items = [(key, params.get("bucket"), params)]
        if op in ("release", "renew", "settle"):
            kind = is_policy_id(params["id"])
            if kind is None and self._held_locally(op, key, params["id"]):
                kind = "local"
            if kind is not None:
                return self.policy_lease(op, items, kind), None
        if self.skip_redis():
            return self.policy(op, items), None
        return None, Call(op, items, self.clock())

    def _held_locally(self, op, key, lease_id):
        with self.lock:
            if op == "settle":
                return (key, lease_id) in self.local_reservations
            return self.local_leases.holds(key, lease_id)

    def policy_lease(self, op, items, kind=None):
        """The failure policy's answer to a lease op; `kind` ("open" or "local") for an id that
        policy made, which is answered by it whatever `on_error` says now."""
        (key, bucket, params), = items
        how = kind or self.on_error
        limit, ttl_ms, lease_id = params.get("limit"), params.get("ttl_ms"), params.get("id")
        unapplied = None
        with self.lock:
            if kind is None:
                self._count_policy()
            else:
                self.counters[kind] += 1
            now_us = self.now_us()
            if op == "lease":
                if how == "open":
                    return Lease(1, policy_id(OPEN_PREFIX), 0, ttl_ms, key, limit, ttl_ms, "open")
                if how == "closed":
                    return Lease(0, "", 0, CLOSED_RETRY_AFTER_MS, key, limit, ttl_ms, "closed")
                reply = self.local_leases.lease(key, limit, ttl_ms, lease_id or policy_id(LOCAL_PREFIX), now_us)
                return Lease(*reply, key, limit, ttl_ms, "local")
            if op in ("release", "renew"):
                if how == "open":
                    # An "open:" lease holds nothing; a Redis lease cannot be reached now: a
                    # renewal answers held (the work goes on, as "open" lets it), a release
                    # answers 0 (the lease expires at its ttl).
                    return kind == "open" or op == "renew"
                if how == "closed":
                    return False
                if op == "release":
                    return bool(self.local_leases.release(key, lease_id, now_us))
                return bool(self.local_leases.renew(key, lease_id, ttl_ms, now_us))
            if op == "leases":
                if how == "open":
                    return LeaseCount(0, 0, limit, "open")
                if how == "closed":
                    return LeaseCount(limit, CLOSED_RETRY_AFTER_MS, limit, "closed")
                return LeaseCount(*self.local_leases.count(key, limit, now_us), limit, "local")
            estimate = params.get("estimate")
            if op == "reserve":
                make = self.reservation_type
                if how == "open":
                    return make(1, policy_id(OPEN_PREFIX), 0, 0, key, bucket, estimate, "open")
                if how == "closed":
                    return make(0, "", 0, CLOSED_RETRY_AFTER_MS, key, bucket, estimate, "closed")
                allowed, remaining, retry, _ = self.local.acquire(key, bucket, estimate, now_us)
                rid = ""
                if allowed:
                    rid = lease_id or policy_id(LOCAL_PREFIX)
                    self._drop_lapsed_reservations(now_us)
                    self.local_reservations[(key, rid)] = (bucket, estimate, now_us + ttl_ms * 1000)
                    while len(self.local_reservations) > self.local_max_keys:
                        self.local_reservations.popitem(last=False)
                return make(allowed, rid, remaining, retry, key, bucket, estimate, "local")
            # settle
            actual = params["actual"]
            if kind == "open":
                return Charge(False, 0, 0, 0, bucket, "open")
            if kind == "local":
                self._drop_lapsed_reservations(now_us)
                record = self.local_reservations.pop((key, lease_id), None)
                if record is None:
                    raise ReservationNotOpenError(
                        f"id {lease_id} is not an open reservation of this key (settled, "
                        "expired or never made)")
                _, reserved, _ = record
                # The difference, exact: over-estimated goes back as a refund gives back,
                # under-estimated is charged as a charge charges.
                over = _decimal.exact(reserved) - _decimal.exact(actual)
                if over > 0:
                    self.local.refund(key, bucket, over, now_us)
                cost = max(Fraction(0), -over)
                try:
                    reply = self.local.charge(key, bucket, cost, now_us, MAX_DEBT_NS)
                except DebtTooLongError:
                    self.local_reservations[(key, lease_id)] = record  # stays open, as the module's
                    raise
                return Charge(*reply, bucket, "local")
            # A Redis reservation while Redis cannot answer: it stands as taken there until its
            # ttl; the difference is the caller's to send again.
            self.counters["unapplied_charges"] += 1
            unapplied = Charge(False, 0, 0, 0, bucket, self.on_error)
        log.warning("redis-rl: the settle of reservation %r on %r (actual %s) was not applied: "
                    "Redis cannot decide; the reservation stands as taken until its ttl", lease_id,
                    key, params.get("actual"))
        return unapplied

    def _drop_lapsed_reservations(self, now_us):
        for entry in [e for e, (_, _, expiry) in self.local_reservations.items() if expiry <= now_us]:
            del self.local_reservations[entry]

    def lease_answer(self, op, items, reply, source):
        """The answer to a lease op from Redis's reply."""
        (key, bucket, params), = items
        if op == "lease":
            return Lease(*reply, key, params["limit"], params["ttl_ms"], source)
        if op in ("release", "renew"):
            return bool(int(reply))
        if op == "leases":
            return LeaseCount(*reply, params["limit"], source)
        if op == "reserve":
            return self.reservation_type(*reply, key, bucket, params["estimate"], source)
        return Charge(True, *reply, bucket, source)

    def now_us(self):
        return int(self.clock() * 1_000_000)

    # One call, before and after the I/O ----------------------------------------------------

    def begin(self, op, items):
        """Everything a call decides before Redis, for op in acquire, peek, refund, charge,
        multi over [(key, limit)] or [(key, limit, cost)]: checks the costs, asks the deny cache and the
        outage state. Returns `(answer, None)` when that decided, else `(None, call)`: run
        `exchange(call)`, then hand its reply to `finish` or its outage to `fail`."""
        items = [(key, limit, check_cost(rest[0] if rest else 1)) for key, limit, *rest in items]
        if not items:
            raise ValueError("acquire_all needs at least one (key, limit)")
        if op in ("acquire", "multi"):
            for index, (key, limit, cost) in enumerate(items):
                hit = self.cached(key, limit, cost)
                if hit is not None:
                    if op == "acquire":
                        return hit, None
                    return MultiDecision(False, index, hit.retry_after_ms, (), "cache"), None
        if op in ("refund", "charge"):
            # A charge may put the key in debt for longer than a remembered denial says.
            self.forget(items[0][0])
        if self.skip_redis():
            return self.policy(op, items), None
        return None, Call(op, items, self.clock())

    def policy(self, op, items):
        """The failure policy's answer to a call."""
        if op in LEASE_OPS:
            return self.policy_lease(op, items)
        if op == "multi":
            return self.policy_acquire_all(items)
        (key, limit, cost), = items
        if op == "refund":
            return self.policy_refund(key, limit, cost)
        if op == "charge":
            return self.policy_charge(key, limit, cost)
        return self.policy_acquire(key, limit, cost, take=(op == "acquire"))

    def fail(self, call, error):
        """The answer to a call Redis could not answer (`is_unavailable(error)`): busy (no
        connection before the deadline) or down (the rest) is logged as such; the policy
        decides either way."""
        if is_busy(error):
            self.busy(error)
        else:
            self.failed(error)
        return self.policy(call.op, call.items)

    def finish(self, call, reply):
        """The answer to a call from Redis's reply; a denial is remembered by the deny cache."""
        source = SOURCE_OF[call.path]
        self.answered(source)
        if call.op in LEASE_OPS:
            return self.lease_answer(call.op, call.items, reply, source)
        if call.op == "refund":
            return Refund(*reply, source)
        if call.op == "charge":
            (_, limit, _), = call.items
            return Charge(*reply, limit, source)
        if call.op == "multi":
            allowed, refused, retry, replies = reply
            decisions = [Decision(*r, limit, source) for r, (_, limit, _) in zip(replies, call.items)]
            if not allowed:
                # Only refusing buckets are remembered, each with its own wait.
                for (key, limit, cost), d in zip(call.items, decisions):
                    self.remember(key, limit, cost, d, call.sent_at)
            return MultiDecision(allowed, refused, retry, decisions, source)
        (key, limit, cost), = call.items
        decision = Decision(*reply, limit, source)
        if call.op == "acquire":
            self.remember(key, limit, cost, decision, call.sent_at)
        return decision

    # The requests of one call ---------------------------------------------------------------

    def exchange(self, call):
        """The requests a call makes, as a generator: it yields each `Request` for the limiter
        to run and is sent its reply (or thrown its error), and returns the command's reply.

        The path is found by sending the call itself and reading the error (see `_walk`); the
        path that answered is kept for the next calls, and found again once it stops answering
        (the module unloaded, the Functions library flushed) or, on the fallback, when a key
        answers WRONGTYPE and the module, loaded since, answers instead (`_after_wrongtype`)."""
        try:
            return (yield from self._walk(call))
        except Exception as error:
            cause = script_acl_failure(error, call.op)
            if cause is not None:
                raise MisconfiguredError(cause) from error
            raise

    def _order(self):
        return ("module",) if self.without_module == "refuse" else PATHS

    def _walk(self, call):
        """Tries the kept path, else each path in order, with the call itself: a path whose
        command the server lacks (unknown command, Function not found) or this user may not
        run (NOPERM on that command) gives way to the next one; WRONGTYPE on the Functions
        library or the script, kept while the module was missing, asks the module once.
        Raises MisconfiguredError when
        none answers for lack of permission, ModuleMissingError under "refuse"."""
        from redis.exceptions import ResponseError

        order = self._order()
        kept = self.mode
        tried, denied = set(), []
        path = kept if kept in order else order[0]
        while True:
            tried.add(path)
            try:
                outcome, value = yield from self._try(path, call)
            except ResponseError as error:
                if not (is_wrongtype(error) and "module" in order and "module" not in tried):
                    raise
                return (yield from self._after_wrongtype(path, call, error))
            if outcome == "reply":
                call.path = path
                if self.mode != path:
                    self.mode = path
                    log.info("redis-rl: using the %s path", PATH_NAMES[path])
                return value
            if outcome == "denied":
                denied.append((path, value))
            if path == kept:
                self.mode = None  # what was kept stopped answering: look again from the top
            left = [p for p in order if p not in tried]
            if not left:
                break
            path = left[0]
        if denied:
            raise MisconfiguredError(noperm_message(denied, call.op))
        raise ModuleMissingError(
            "the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this limiter "
            'was built with without_module="refuse"; load the module or use without_module="lua"')

    def _after_wrongtype(self, path, call, error):
        """The Functions library or the script, kept since the module was missing, met a key of
        another type. Once the module is loaded, processes on the module path convert the
        buckets the fallback wrote to the module's type, which the fallback cannot read: so the
        module is tried with the same call, once. If it answers (a reply, or an error of its
        own: a key of a type neither knows still gets WRONGTYPE), the module path is kept from
        now on; if it is missing or this user may not run it, the fallback's WRONGTYPE is
        raised as it came."""
        from redis.exceptions import ResponseError

        try:
            outcome, value = yield from self._try("module", call)
        except ResponseError:
            self._switch_to_module(path)
            raise
        if outcome != "reply":
            raise error
        self._switch_to_module(path)
        call.path = "module"
        return value

    def _switch_to_module(self, path):
        if self.mode != "module":
            self.mode = "module"
            log.info("redis-rl: the %s met a key of another type (WRONGTYPE) and the module "
                     "answers: using the module path", PATH_NAMES[path])

    def _try(self, path, call):
        """One path's attempt: ("reply", reply), ("absent", None), ("old", None) or
        ("denied", [commands this user may not run])."""
        from redis.exceptions import RedisError, ResponseError

        keys = [key for key, _, _ in call.items]
        if path == "module":
            args = self.module_command(call.op, call.items)
            try:
                return "reply", (yield Request(args, keys, direct=(call.op == "multi")))
            except RedisError as error:
                # redis-py's cluster client says so itself when the server has no such command.
                if is_unknown_command(error) or "command doesn't exist" in str(error):
                    return "absent", None
                if is_noperm(error):
                    return "denied", [args[0].lower()]
                raise
        numbers = self.script_numbers(call.op, call.items)
        # A one-key acquire, the call an application makes most, is answered packed on both
        # fallback paths (rl_acquire_packed, the script's short form): 32 bytes, read undecoded
        # (`raw`) and unpacked here.
        packed = call.op == "acquire" and len(keys) == 1
        read = short_reply if packed else _as_sent
        if path == "functions":
            if self.functions_version is None:
                # Texts, which every version reads (an older library would misread packed
                # numbers before its version is known).
                probe = Limit(1, 1).script_args(1)
                outcome = yield from self._functions_version(keys, probe)
                if outcome is not None:
                    return outcome
            name = "FCALL_RO" if call.op in ("peek", "leases") else "FCALL"
            function = "rl_acquire_packed" if packed else "rl_" + call.op
            try:
                reply = yield Request([name, function, str(len(keys)), *keys, *numbers], keys, raw=packed)
            except ResponseError as error:
                if is_function_missing(error):
                    self.functions_version = None
                    return "absent", None
                if is_noperm(error):
                    return "denied", [name.lower()]
                raise
            return "reply", read(reply)
        # The script: EVALSHA with the hash computed here; on NOSCRIPT the same call as EVAL,
        # which runs it and caches it on the server again. Never SCRIPT LOAD. A one-key acquire
        # sends its 80 packed bytes without the mode (the script's short form: one Lua string
        # and one argument fewer for Redis to make).
        if packed:
            tail = ["1", *keys, *numbers]
        else:
            tail = [str(len(keys)), *keys, call.op, *numbers]
        denied = []
        if not self.evalsha_denied:
            try:
                reply = yield Request(["EVALSHA", self.sha, *tail], keys, raw=packed)
            except ResponseError as error:
                if is_noperm(error):
                    self.evalsha_denied = True
                elif not is_noscript(error):
                    raise
            else:
                return "reply", read(reply)
        if self.evalsha_denied:
            denied.append("evalsha")
        try:
            reply = yield Request(["EVAL", self.script, *tail], keys, raw=packed)
        except ResponseError as error:
            if is_noperm(error):
                return "denied", denied + ["eval"]
            raise
        return "reply", read(reply)

    def _functions_version(self, keys, numbers):
        """Checks the loaded library's version once (FCALL_RO rl_version 0, on the node of the
        call's first key). None when it will do, else the outcome that moves on to the script."""
        from redis.exceptions import ResponseError

        try:
            version = yield Request(["FCALL_RO", "rl_version", "0"], keys[:1], to_key=True)
        except ResponseError as error:
            if is_noperm(error):
                return "denied", ["fcall_ro"]
            if not is_function_missing(error):
                raise
            version = None
        if version is None:
            # No rl_version: no library, or one older than version 1. A peek (which writes
            # nothing) tells them apart.
            try:
                yield Request(["FCALL_RO", "rl_peek", "1", keys[0], *numbers[:10]], keys[:1])
            except ResponseError as error:
                if is_function_missing(error) or is_noperm(error):
                    return "absent", None
                raise
            version = 0
        try:
            version = int(version)
        except (TypeError, ValueError):
            version = 0
        if version < FUNCTIONS_VERSION:
            log.error("redis-rl: the Functions library redis_rl on the server is version %d, this "
                      "client needs version %d; using the script until it is loaded again "
                      "(redis_rl.load_functions(client), or redis-cli -x FUNCTION LOAD REPLACE < "
                      "rl_functions.lua, on every master)", version, FUNCTIONS_VERSION)
            return "old", None
        self.functions_version = version
        return None

    def module_command(self, op, items):
        """The module command for op in acquire, peek, refund, charge, multi over
        [(key, limit, cost)], or a lease op (`LEASE_OPS`) over [(key, limit, params)]."""
        if op in LEASE_OPS:
            return lease_module_command(op, items)
        if op == "multi":
            args = ["RL.ACQUIRE.MULTI"]
            for key, limit, cost in items:
                args += [key, *limit.args(), _number(cost)]
            return args
        (key, limit, cost), = items
        table = getattr(key, "table", None)
        if table is not None:  # a bucket table's field (redis_rl.table.TableField)
            return [{"acquire": "RL.HACQUIRE", "peek": "RL.HPEEK", "refund": "RL.HREFUND",
                     "charge": "RL.HCHARGE"}[op],
                    table, key.field, *limit.args(), _number(cost)]
        return [{"acquire": "RL.ACQUIRE", "peek": "RL.PEEK", "refund": "RL.REFUND",
                 "charge": "RL.CHARGE"}[op],
                key, *limit.args(), _number(cost)]

    def script_numbers(self, op, items):
        """The 10 numbers per key that the script and the Functions library take, packed in one
        argument per key (for a lease op: its arguments after the key, as clients/lua/rl.lua's
        header lists them)."""
        if op in LEASE_OPS:
            return lease_script_args(op, items)
        return [limit.script_packed(cost, refund=(op == "refund")) for _, limit, cost in items]

    # Startup --------------------------------------------------------------------------------

    def check_steps(self, cluster_client):
        """`check()` as requests: finds the path with a peek (which writes nothing) of
        CHECK_KEYS[0] and, on a client of one server, asks the path for a call over two keys in
        different slots that writes nothing (cost 0): a cluster node answers CROSSSLOT.
        Returns the path."""
        from redis.exceptions import ResponseError

        probe = Limit(1, 1)
        yield from self.exchange(Call("peek", [(CHECK_KEYS[0], probe, 1)], self.clock()))
        path = self.mode
        if not cluster_client:
            items = [(key, probe, 0) for key in CHECK_KEYS]
            try:
                yield from self._try(path, Call("multi", items, self.clock()))
            except ResponseError as error:
                if is_cluster_redirect(error):
                    raise MisconfiguredError(cluster_message(error)) from error
                if not is_noperm(error):
                    raise
        return path

    def probe_steps(self, key):
        """The path, found as `check` finds it (a peek of `key`) when not known yet."""
        if self.mode is None:
            yield from self.exchange(Call("peek", [(key, Limit(1, 1), 1)], self.clock()))
        return self.mode

    # Misconfiguration -----------------------------------------------------------------------

    def misconfigured(self, call, error):
        """The policy's answer to a call that met a misconfiguration: logged at error level
        (once per cause every MISCONFIGURED_LOG_S), counted, and no outage."""
        cause = str(error)
        with self.lock:
            self.counters["misconfigured"] += 1
            now = self.clock()
            last = self.misconfigured_logged.get(cause)
            due = last is None or now - last >= MISCONFIGURED_LOG_S
            if due:
                self.misconfigured_logged[cause] = now
        if due:
            log.error("redis-rl: misconfigured, not down: %s; deciding with on_error=%r (%d so far)",
                      cause, self.on_error, self.counters["misconfigured"])
        return self.policy(call.op, call.items)


#: The version of the Functions library (clients/lua/rl_functions.lua) this client needs.
FUNCTIONS_VERSION = 5
#: The calls on leases and reservations.
LEASE_OPS = ("lease", "release", "renew", "leases", "reserve", "settle")


def _id_arg(value):
    return value if isinstance(value, bytes) else str(value)


def lease_module_command(op, items):
    """The module command of a lease op over [(key, limit, params)]."""
    (key, bucket, p), = items
    given = ["ID", _id_arg(p["id"])] if p.get("id") is not None else []
    if op == "lease":
        return ["RL.LEASE", key, str(p["limit"]), str(p["ttl_ms"]), *given]
    if op == "release":
        return ["RL.RELEASE", key, _id_arg(p["id"])]
    if op == "renew":
        return ["RL.RENEW", key, _id_arg(p["id"]), str(p["ttl_ms"])]
    if op == "leases":
        return ["RL.LEASES", key, str(p["limit"])]
    # A bucket table's field (redis_rl.table.TableField): RL.HRESERVE / RL.HSETTLE on its table
    # key and field; on the fallbacks the field's own key is the string itself.
    table = getattr(key, "table", None)
    where = [key] if table is None else [table, key.field]
    if op == "reserve":
        return ["RL.RESERVE" if table is None else "RL.HRESERVE", *where, *bucket.args(),
                _number(p["estimate"]), str(p["ttl_ms"]), *given]
    return ["RL.SETTLE" if table is None else "RL.HSETTLE", *where, *bucket.args(), _id_arg(p["id"]),
            _number(p["actual"])]


def lease_script_args(op, items):
    """The arguments after the key of the fallback's lease op (the function form; the script
    takes the op's name first): as clients/lua/rl.lua's header lists them. The id of a take is
    always sent (the caller's, or one drawn here)."""
    (key, bucket, p), = items
    if op == "lease":
        return [str(p["limit"]), str(p["ttl_ms"]), _id_arg(p.get("id") or p["fallback_id"])]
    if op == "release":
        return [_id_arg(p["id"])]
    if op == "renew":
        return [_id_arg(p["id"]), str(p["ttl_ms"])]
    if op == "leases":
        return [str(p["limit"])]
    if op == "reserve":
        return [bucket.script_packed(p["estimate"]), str(p["ttl_ms"]),
                _id_arg(p.get("id") or p["fallback_id"])]
    # A settle's numbers are a charge's for the actual cost (rounded up, as a charge rounds).
    return [bucket.script_packed(p["actual"]), _id_arg(p["id"])]
PATHS = ("module", "functions", "lua")
PATH_NAMES = {"module": "module", "functions": "Functions library", "lua": "script"}
SOURCE_OF = {"module": "redis", "functions": "functions", "lua": "lua"}
#: What check() peeks: two keys whose slots differ ({a} is slot 15495, {b} 3300).
CHECK_KEYS = ("redis-rl:check:{a}", "redis-rl:check:{b}")
MISCONFIGURED_LOG_S = 10.0
PERMISSIONS_DOC = "docs/clients.md#permissions"
#: The ACL rules that let a user take each path (clients/vectors/permissions.json).
PATH_RULES = {
    "module": "+rl.acquire +rl.peek +rl.refund +rl.charge +rl.acquire.multi +rl.hacquire "
              "+rl.hpeek +rl.hrefund +rl.hcharge",
    "functions": "+fcall +fcall_ro +time +get +set +hmget +hset +pexpireat +del",
    "lua": "+evalsha +eval +time +get +set +hmget +hset +pexpireat +del",
}


#: The rules a user of leases needs on each path, and what reservations add to a deciding
#: user's (clients/vectors/permissions.json's "leases" and "reservations").
LEASE_PATH_RULES = {
    "module": "+rl.lease +rl.release +rl.renew +rl.leases",
    "functions": "+fcall +fcall_ro +time +zcount +zscore +zrange +zrangebyscore "
                 "+zremrangebyscore +zadd +zrem +pexpireat",
    "lua": "+evalsha +eval +time +zcount +zscore +zrange +zrangebyscore +zremrangebyscore "
           "+zadd +zrem +pexpireat",
}
RESERVATION_RULES = {"module": "+rl.reserve +rl.settle", "functions": "+hget +hgetall +hdel",
                     "lua": "+hget +hgetall +hdel"}


def _rules(path, op):
    if op in ("lease", "release", "renew", "leases"):
        return LEASE_PATH_RULES[path]
    if op in ("reserve", "settle"):
        return f"{PATH_RULES[path]} {RESERVATION_RULES[path]}"
    return PATH_RULES[path]


def noperm_message(denied, op=None):
    """`NOPERM: this user may not run 'fcall' (nor 'evalsha', 'eval'); add ...` for the
    [(path, [commands])] no path answered for, with the rules of the call `op` asked for."""
    commands = [c for _, cs in denied for c in cs]
    first, rest = commands[0], commands[1:]
    nor = f" (nor {', '.join(repr(c) for c in rest)})" if rest else ""
    rules = " or ".join(f'"{_rules(path, op)}"' for path, _ in denied)
    return (f"NOPERM: this user may not run {first!r}{nor}; add the ACL rules {rules} "
            f"or see {PERMISSIONS_DOC}")


def is_noperm(error):
    from redis import exceptions as e

    kind = getattr(e, "NoPermissionError", None)
    return (kind is not None and isinstance(error, kind)) or str(error).startswith("NOPERM")


def is_function_missing(error):
    text = str(error).lower()
    return "function not found" in text or "unknown command" in text


#: What a function or script runs inside, by the call (clients/vectors/permissions.json).
_INSIDE = {"decide": ("TIME, GET, SET, HMGET, HSET, PEXPIREAT or DEL",
                       "+time +get +set +hmget +hset +pexpireat +del"),
           "leases": ("TIME, ZCOUNT, ZSCORE, ZRANGE, ZRANGEBYSCORE, ZREMRANGEBYSCORE, ZADD, ZREM "
                      "or PEXPIREAT", "+time +zcount +zscore +zrange +zrangebyscore "
                      "+zremrangebyscore +zadd +zrem +pexpireat"),
           "reservations": ("TIME, GET, SET, HMGET, HGET, HGETALL, HSET, HDEL, PEXPIREAT or DEL",
                            "+time +get +set +hmget +hset +pexpireat +del +hget +hgetall +hdel")}


def script_acl_failure(error, op=None):
    """The cause when a function or script met NOPERM on a command it runs (Redis: "The user
    executing the script can't run this command", Valkey: "ACL failure in script: ... the
    'time' command"), else None; the rules named are those of the call `op`."""
    from redis import exceptions as e

    if not isinstance(error, e.ResponseError):
        return None
    text = str(error)
    if "user executing the script can't run" not in text and "ACL failure in script" not in text:
        return None
    part = ("leases" if op in ("lease", "release", "renew", "leases")
            else "reservations" if op in ("reserve", "settle") else "decide")
    commands, rules = _INSIDE[part]
    named = re.search(r"run the '([^']+)' command", text)
    what = f"the command {named.group(1)!r}" if named else f"a command it runs ({commands})"
    return (f"NOPERM: this user may not run {what} inside the redis-rl function or script "
            f"({text.strip()}); add the ACL rules \"{rules}\" or see {PERMISSIONS_DOC}")


def is_cluster_redirect(error):
    """MOVED, ASK or CROSSSLOT: a cluster node's answer (redis-py parses each into its own
    class, dropping the code from the text)."""
    return is_crossslot(error) or _code(error) in ("MOVED", "ASK")


def is_crossslot(error):
    """Whether `error` says the keys of one command span several slots."""
    return _code(error) == "CROSSSLOT" or "all keys must map to the same key slot" in str(error)


def _code(error):
    from redis import exceptions as e

    for code, name in (("MOVED", "MovedError"), ("ASK", "AskError"), ("CROSSSLOT", "ClusterCrossSlotError")):
        kind = getattr(e, name, None)
        if (kind is not None and isinstance(error, kind)) or str(error).startswith(code):
            return code
    return None


def cluster_message(error):
    code = _code(error)
    return (f"a client of one server is connected to a Redis Cluster ({code} {error}): use "
            "redis.RedisCluster (redis_rl.connect_cluster)")


def misconfiguration(error, cluster_client):
    """The cause when `error` is a misconfiguration rather than an outage (see
    docs/clients.md#a-misconfiguration-is-not-an-outage), else None."""
    from redis import exceptions as e

    if isinstance(error, MisconfiguredError):
        return str(error)
    text = str(error)
    auth = getattr(e, "AuthenticationError", None)
    if (auth is not None and isinstance(error, auth)) or text.startswith(("WRONGPASS", "NOAUTH")) \
            or "invalid username-password pair" in text or "invalid password" in text:
        return f"authentication failed: {text}"
    if is_noperm(error):
        return f"{text}; see {PERMISSIONS_DOC}"
    cause = script_acl_failure(error)
    if cause is not None:
        return cause
    if "cluster support disabled" in text or "Cluster mode is not enabled" in text:
        return (f"a cluster client is connected to a server that is not a cluster ({text}): use "
                "redis.Redis (redis_rl.connect)")
    if not cluster_client and is_cluster_redirect(error):
        return cluster_message(error)
    if cluster_client and "unknown command 'COMMAND'" in text:
        return (f"redis-py's cluster client reads the server's command table with COMMAND as it "
                f"starts, and this server renamed it away or disabled it ({text})")
    return None


class Call:
    """One call that needs Redis: its op, its checked items, when it was sent (the deny cache
    counts a denial's wait from then: the server decided after it), and the path that
    answered it."""

    __slots__ = ("op", "items", "sent_at", "path")

    def __init__(self, op, items, sent_at):
        self.op, self.items, self.sent_at, self.path = op, items, sent_at, None


class Request:
    """One command for the limiter to send: `args`, and the `keys` it names. On a cluster
    client it goes to the node of the first key's slot, addressed by the limiter (redis-py
    would otherwise ask the server for FCALL's keys, and look module commands up in a command
    table read with COMMAND); on that node's own connection when `direct` (RL.ACQUIRE.MULTI,
    whose two dots redis-py refuses) or when the keys span slots (the server then answers
    CROSSSLOT). `to_key`: a keyless command sent to the first key's node. `raw`: the reply is
    read as bytes whatever the client's decode_responses (the script's packed reply)."""

    __slots__ = ("args", "keys", "direct", "to_key", "raw")

    def __init__(self, args, keys=(), direct=False, to_key=False, raw=False):
        self.args, self.keys, self.direct, self.to_key = args, list(keys), direct, to_key
        self.raw = raw


def _as_sent(reply):
    """A reply the fallback answers as the module does: read as it came."""
    return reply


def short_reply(reply):
    """The script's short form and the Functions library's rl_acquire_packed answer an
    acquire's four numbers (allowed, remaining, retry_after_ms, reset_after_ms) packed: 32
    bytes, four little-endian doubles, each a whole number. Anything else is not their
    reply."""
    from redis.exceptions import ResponseError

    if not isinstance(reply, (bytes, bytearray)) or len(reply) != 32:
        raise ResponseError("redis-rl script: the short form's reply is not 32 bytes: %r" % (reply,))
    return [int(x) for x in struct.unpack("<4d", reply)]


class LimiterBase:
    """What the sync and asyncio limiters share besides the engine: the read-only views."""

    _engine: "Engine"

    @property
    def counters(self) -> Dict[str, int]:
        """Decisions by source ("redis", "functions", "lua", "cache", "local", "open",
        "closed"), and the outages, busy calls, misconfigured calls and unapplied charges seen,
        as a new dict."""
        with self._engine.lock:
            return dict(self._engine.counters)

    @property
    def path(self) -> Optional[str]:
        """How Redis is reached: "module", "functions" (the Functions library), "lua" (the
        script), or None before a call found it."""
        return self._engine.mode


def monotonic() -> float:
    return time.monotonic()


def lease_params(op, limit=None, ttl_ms=None, lease_id=None, bucket=None, estimate=None,
                 actual=None):
    """The checked arguments of a lease op, or ValueError naming the first bad one (in the
    module's order and words)."""
    params = {}
    if op in ("reserve", "settle"):
        if not isinstance(bucket, Limit):
            raise TypeError(f"limit must be a redis_rl.Limit, got {type(bucket).__name__}")
        params["bucket"] = bucket
    if op in ("lease", "leases"):
        params["limit"] = check_limit(limit)
    if op == "reserve":
        try:
            params["estimate"] = check_cost(estimate)
        except ValueError:
            raise ValueError("estimate must be a number above 0 (tokens)") from None
        if _decimal.exact(params["estimate"]) <= 0:
            raise ValueError("estimate must be a number above 0 (tokens)")
    if op in ("lease", "renew", "reserve"):
        params["ttl_ms"] = check_ttl(ttl_ms)
    if op == "settle":
        try:
            params["actual"] = check_cost(actual)
        except ValueError:
            raise ValueError("actual must be a finite number >= 0 (tokens)") from None
    if op in ("release", "renew", "settle") or lease_id is not None:
        params["id"] = check_id(lease_id)
    if op in ("lease", "reserve") and is_policy_id(lease_id):
        # Its release or settle would be answered in process, never reaching the Redis lease.
        raise ValueError('id must not start with "open:" or "local:" (the failure policy\'s ids)')
    return params
