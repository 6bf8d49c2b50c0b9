"""Leases (at most N in flight per key) and reservations (take an estimate now, settle the
actual later), on top of the limiter's calls.

The types the calls return (`Lease`, `LeaseCount`, `Reservation`), the in-process lease table
of the "local" failure policy (`LocalLeases`, the module's RL.LEASE semantics), and the
scopes: `Limiter.hold(...)` (`Hold`, a `with` block) and `redis_rl.asyncio.Limiter.hold(...)`
(`AsyncHold`, `async with`), which wait for a free slot up to a timeout (see `_sleep_s`), renew the lease in the
background at half its ttl while the block runs, and release it when the block ends, by an
exception included.
"""

from __future__ import annotations

import math
import secrets
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

#: The module's bounds (docs/commands/rl.lease.md).
MAX_LEASE_LIMIT = 10_000
MAX_TTL_MS = 3_153_600_000_000
#: Ids the failure policy makes: never sent to Redis.
OPEN_PREFIX = "open:"
LOCAL_PREFIX = "local:"

Id = Union[str, bytes]


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LEASE_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LEASE_LIMIT} (leases)")
    return limit


def check_ttl(ttl_ms: Any) -> int:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 1 <= ttl_ms <= MAX_TTL_MS:
        raise ValueError(f"ttl_ms must be an integer from 1 to {MAX_TTL_MS} (ms)")
    return ttl_ms


def check_id(lease_id: Any) -> Id:
    raw = lease_id.encode("utf-8") if isinstance(lease_id, str) else lease_id
    if not isinstance(raw, bytes) or not 1 <= len(raw) <= 16:
        raise ValueError("id must be 1 to 16 bytes")
    return lease_id


def new_id() -> str:
    """16 lowercase hex characters from the CSPRNG: the id the client sends to the fallback
    (a script cannot draw randomness), as the module would make one."""
    return secrets.token_hex(8)


def reply_id(value: Any) -> Id:
    """An id as a reply carries it: text when it is UTF-8 (every id the server makes is),
    else the bytes."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def policy_id(prefix: str) -> str:
    """An id the failure policy makes: the prefix, then random hex up to 16 characters."""
    return prefix + secrets.token_hex(8)[:16 - len(prefix)]


def is_policy_id(lease_id: Any) -> Optional[str]:
    """"open" or "local" for an id the failure policy made, else None."""
    if isinstance(lease_id, str):
        if lease_id.startswith(OPEN_PREFIX):
            return "open"
        if lease_id.startswith(LOCAL_PREFIX):
            return "local"
    return None


def _ceil_s(ms: int) -> int:
    return -(-ms // 1000)


class Lease:
    """The answer of `lease`: RL.LEASE's reply and who gave it.

    `allowed`; `id` (the lease's, "" when denied); `in_use` (leases held after the call, this
    one included); `expires_in_ms` (until this lease expires, when allowed) or
    `retry_after_ms` (until a slot frees, when denied; the other is 0); the `key`, `limit` and
    `ttl_ms` asked for; `source` as in `Decision` ("redis", "functions", "lua", or the failure
    policy "local", "open", "closed"). An "open" lease's id starts with "open:" and a "local"
    one's with "local:": neither is ever sent to Redis.
    """

    __slots__ = ("allowed", "id", "in_use", "expires_in_ms", "retry_after_ms", "key", "limit",
                 "ttl_ms", "source")
    allowed: bool
    id: Id
    in_use: int
    expires_in_ms: int
    retry_after_ms: int
    key: str
    limit: int
    ttl_ms: int
    source: str

    def __init__(self, allowed: Any, lease_id: Any, in_use: Any, ms: Any, key: str, limit: int,
                 ttl_ms: int, source: str) -> None:
        self.allowed = bool(allowed)
        self.id = reply_id(lease_id)
        self.in_use = int(in_use)
        self.expires_in_ms = int(ms) if self.allowed else 0
        self.retry_after_ms = 0 if self.allowed else int(ms)
        self.key, self.limit, self.ttl_ms, self.source = key, limit, ttl_ms, source

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (f"Lease(allowed={self.allowed}, id={self.id!r}, in_use={self.in_use}, "
                f"expires_in_ms={self.expires_in_ms}, retry_after_ms={self.retry_after_ms}, "
                f"key={self.key!r}, limit={self.limit}, source={self.source!r})")

    def headers(self) -> Dict[str, str]:
        """X-RateLimit-Limit, X-RateLimit-Remaining (`max(0, limit - in_use)`, unless the "open"
        or "closed" policy answered, which knows no count) and, when denied, Retry-After
        (seconds, rounded up)."""
        headers = {"X-RateLimit-Limit": str(self.limit)}
        if self.source not in ("open", "closed"):
            headers["X-RateLimit-Remaining"] = str(max(0, self.limit - self.in_use))
        if not self.allowed:
            headers["Retry-After"] = str(_ceil_s(self.retry_after_ms))
        return headers


class LeaseCount:
    """The answer of `leases`: RL.LEASES's `in_use` and `retry_after_ms` (0 when a slot is
    free), the `limit` asked for and the `source`."""

    __slots__ = ("in_use", "retry_after_ms", "limit", "source")

    def __init__(self, in_use: Any, retry_after_ms: Any, limit: int, source: str) -> None:
        self.in_use = int(in_use)
        self.retry_after_ms = int(retry_after_ms)
        self.limit = limit
        self.source = source

    def __repr__(self) -> str:
        return (f"LeaseCount(in_use={self.in_use}, retry_after_ms={self.retry_after_ms}, "
                f"limit={self.limit}, source={self.source!r})")


class Reservation:
    """The answer of `reserve`: RL.RESERVE's reply, and the handle that settles it.

    `allowed`, `id` ("" when denied), `remaining` (whole tokens left after the take),
    `retry_after_ms` (0 when allowed; -1 when the estimate exceeds the capacity), the `key`,
    `limit` and `estimate`, and `source`. `settle(actual)` settles it once (RL.SETTLE) and
    returns a `Charge` (its `remaining` is the signed balance); calling it again returns that
    same Charge without sending anything. `Limiter.settle(key, limit, id, actual)` sends a
    settle by id: a second one is refused by the server (`ReservationNotOpenError`).
    """

    __slots__ = ("allowed", "id", "remaining", "retry_after_ms", "key", "limit", "estimate",
                 "source", "_limiter", "_settled")

    def __init__(self, allowed: Any, reservation_id: Any, remaining: Any, retry_after_ms: Any,
                 key: str, limit: Any, estimate: Any, source: str, limiter: Any = None) -> None:
        self.allowed = bool(allowed)
        self.id = reply_id(reservation_id)
        self.remaining = int(remaining)
        self.retry_after_ms = int(retry_after_ms)
        self.key, self.limit, self.estimate, self.source = key, limit, estimate, source
        self._limiter = limiter
        self._settled: Any = None

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (f"Reservation(allowed={self.allowed}, id={self.id!r}, remaining={self.remaining}, "
                f"retry_after_ms={self.retry_after_ms}, key={self.key!r}, limit={self.limit!r}, "
                f"estimate={self.estimate!r}, source={self.source!r})")

    def _check_settle(self) -> None:
        if not self.allowed:
            raise ValueError("a denied reservation holds nothing to settle")
        if self._limiter is None:
            raise ValueError("this reservation has no limiter to settle with")

    def settle(self, actual: Any) -> Any:
        """Settles with the `actual` cost, once: a Charge. Again: the first Charge."""
        if self._settled is not None:
            return self._settled
        self._check_settle()
        self._settled = self._limiter.settle(self.key, self.limit, self.id, actual)
        return self._settled


class AsyncReservation(Reservation):
    """`Reservation` of `redis_rl.asyncio.Limiter`: `await reservation.settle(actual)`."""

    __slots__ = ()

    async def settle(self, actual: Any) -> Any:  # type: ignore[override]
        if self._settled is not None:
            return self._settled
        self._check_settle()
        self._settled = await self._limiter.settle(self.key, self.limit, self.id, actual)
        return self._settled


class LocalLeases:
    """The "local" policy's leases: per key, the held ids and their absolute expiry (µs), with
    RL.LEASE's rules (an expired lease counts for nothing; a retried take of a held id is
    answered as held and changes nothing; a denial says when the lease that frees a slot
    expires, rounded up). The limit is shared as a bucket's rate is: `limit // instances`, at
    least 1. At most `max_keys` keys are kept, least recently used out. The caller holds the
    engine's lock."""

    def __init__(self, instances: int, max_keys: int = 100_000) -> None:
        self.instances = instances
        self.max_keys = max_keys
        self.keys: "OrderedDict[str, Dict[Any, int]]" = OrderedDict()

    def _share(self, limit: int) -> int:
        return max(1, limit // self.instances)

    def _held(self, key: str, now_us: int) -> Dict[Any, int]:
        held = self.keys.get(key)
        if held is None:
            return {}
        for lease_id in [i for i, expiry in held.items() if expiry <= now_us]:
            del held[lease_id]
        self.keys.move_to_end(key)
        return held

    def _retry(self, held: Dict[Any, int], limit: int, now_us: int) -> int:
        expiries = sorted(held.values())
        return max(0, math.ceil((expiries[len(expiries) - limit] - now_us) / 1000))

    def lease(self, key: str, limit: int, ttl_ms: int, lease_id: Any, now_us: int) -> list:
        limit = self._share(limit)
        held = self._held(key, now_us)
        if lease_id in held:
            return [1, lease_id, len(held), math.ceil((held[lease_id] - now_us) / 1000)]
        if len(held) >= limit:
            return [0, "", len(held), self._retry(held, limit, now_us)]
        held[lease_id] = now_us + ttl_ms * 1000
        self.keys[key] = held
        self.keys.move_to_end(key)
        while len(self.keys) > self.max_keys:
            self.keys.popitem(last=False)
        return [1, lease_id, len(held), ttl_ms]

    def release(self, key: str, lease_id: Any, now_us: int) -> int:
        held = self._held(key, now_us)
        if held.pop(lease_id, None) is None:
            return 0
        if not held:
            self.keys.pop(key, None)
        return 1

    def renew(self, key: str, lease_id: Any, ttl_ms: int, now_us: int) -> int:
        held = self._held(key, now_us)
        if lease_id not in held:
            return 0
        held[lease_id] = now_us + ttl_ms * 1000
        return 1

    def count(self, key: str, limit: int, now_us: int) -> list:
        limit = self._share(limit)
        held = self._held(key, now_us)
        if len(held) < limit:
            return [len(held), 0]
        return [len(held), self._retry(held, limit, now_us)]

    def holds(self, key: str, lease_id: Any) -> bool:
        held = self.keys.get(key)
        return held is not None and lease_id in held
