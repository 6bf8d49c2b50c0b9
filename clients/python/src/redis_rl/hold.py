"""Leases as scopes: `with limiter.hold(...)` (`Hold`) and `async with limiter.hold(...)`
(`AsyncHold`), which wait for a free slot up to a timeout (see `_sleep_s`), renew the lease in
the background at half its ttl while the block runs (`Held`, `AsyncHeld`: also what the HTTP
middlewares hold a request's lease with), and release it when the block ends, by an exception
included. Built only on the limiter's public `lease`, `renew` and `release`, so the failure
policy and the fallbacks apply unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from typing import Any, Optional, Union

from .lease import Id, Lease, check_limit, check_ttl
from .wait import WaitTimeoutError

log = logging.getLogger("redis_rl")

#: The jitter added to each sleep while waiting for a slot, as a fraction of retry_after_ms.
JITTER = 0.1
_MIN_SLEEP_S = 0.001


class LeaseTimeoutError(WaitTimeoutError):
    """`hold` found no free slot within `wait` seconds; `lease` (also `decision`) is the last
    denial."""

    def __init__(self, lease: Lease, timeout_s: float) -> None:
        Exception.__init__(self, f"no lease on {lease.key!r} (limit {lease.limit}) within "
                                 f"{timeout_s:g} s: {lease.in_use} held, last retry_after_ms="
                                 f"{lease.retry_after_ms}")
        self.lease = lease
        self.decision = lease


def _check_wait(wait: Optional[float]) -> None:
    if wait is not None and not (isinstance(wait, (int, float)) and wait >= 0):
        raise ValueError("wait must be None (no limit) or a number of seconds >= 0")


#: The first and the longest poll while waiting for a slot, in s (see `_sleep_s`).
POLL_FIRST_S = 0.005
POLL_MAX_S = 1.0


def _sleep_s(lease: Lease, deadline: Optional[float], now: float, wait: Optional[float],
             tries: int) -> float:
    """After a denial: the sleep before the next try, or LeaseTimeoutError once the deadline
    has passed. A denial's retry_after_ms is when a slot frees at the latest (the earliest
    lease's expiry); a release frees one sooner and nothing says so, so the sleep is also
    capped by a poll that starts at 5 ms and doubles up to 1 s, with jitter, and by the
    deadline."""
    poll_s = min(POLL_MAX_S, POLL_FIRST_S * 2 ** min(tries, 10))
    sleep_s = min(poll_s, lease.retry_after_ms / 1000) * (1 + random.uniform(0, JITTER))
    sleep_s = max(_MIN_SLEEP_S, sleep_s)
    if deadline is None:
        return sleep_s
    left_s = deadline - now
    if left_s <= 0:
        raise LeaseTimeoutError(lease, wait or 0)
    return min(sleep_s, left_s)


def _renew_every_s(ttl_ms: int) -> float:
    return max(0.001, ttl_ms / 2000)


class Held:
    """A lease being held (sync): renewed by a daemon thread at half its ttl until `close()`,
    which stops the renewer and releases the lease, once. `lost` turns True when a renewal
    found the lease gone (it expired, or was released elsewhere)."""

    def __init__(self, limiter: Any, lease: Lease, renew: bool = True) -> None:
        self.limiter, self.lease, self.lost = limiter, lease, False
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if renew and lease.source != "open":
            self._thread = threading.Thread(target=self._renew, name="redis-rl-renew", daemon=True)
            self._thread.start()

    def _renew(self) -> None:
        lease = self.lease
        while not self._stop.wait(_renew_every_s(lease.ttl_ms)):
            try:
                if not self.limiter.renew(lease.key, lease.id, lease.ttl_ms):
                    self.lost = True
                    log.warning("redis-rl: the lease %r on %r was gone when renewed", lease.id, lease.key)
                    return
            except Exception as error:  # the next renewal tries again
                log.warning("redis-rl: renewing the lease %r on %r failed: %s", lease.id, lease.key, error)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self.limiter.release(self.lease.key, self.lease.id)
        except Exception as error:  # the lease expires at its ttl
            log.warning("redis-rl: releasing the lease %r on %r failed (it expires in at most "
                        "%d ms): %s", self.lease.id, self.lease.key, self.lease.ttl_ms, error)


class AsyncHeld:
    """`Held` for asyncio: the renewer is a task of the running loop, cancelled by `close()`."""

    def __init__(self, limiter: Any, lease: Lease, renew: bool = True) -> None:
        self.limiter, self.lease, self.lost = limiter, lease, False
        self._closed = False
        self._task: Optional[asyncio.Task] = None
        if renew and lease.source != "open":
            self._task = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        lease = self.lease
        while True:
            await asyncio.sleep(_renew_every_s(lease.ttl_ms))
            try:
                if not await self.limiter.renew(lease.key, lease.id, lease.ttl_ms):
                    self.lost = True
                    log.warning("redis-rl: the lease %r on %r was gone when renewed", lease.id, lease.key)
                    return
            except Exception as error:  # the next renewal tries again
                log.warning("redis-rl: renewing the lease %r on %r failed: %s", lease.id, lease.key, error)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # its cancellation, or an error already logged
                pass
        try:
            await self.limiter.release(self.lease.key, self.lease.id)
        except Exception as error:  # the lease expires at its ttl
            log.warning("redis-rl: releasing the lease %r on %r failed (it expires in at most "
                        "%d ms): %s", self.lease.id, self.lease.key, self.lease.ttl_ms, error)


class _Hold:
    """What `Hold` and `AsyncHold` share: the arguments, checked before any call, and the
    lease they hold while the block runs."""

    held: Optional[Union[Held, AsyncHeld]]

    def __init__(self, limiter: Any, key: str, limit: int, ttl_ms: int, wait: Optional[float],
                 lease_id: Optional[Id], renew: bool) -> None:
        check_limit(limit)
        check_ttl(ttl_ms)
        _check_wait(wait)
        self.limiter, self.key, self.limit, self.ttl_ms = limiter, key, limit, ttl_ms
        self.wait, self.id, self.renew = wait, lease_id, renew
        self.held = None

    @property
    def lost(self) -> bool:
        """Whether a renewal found the lease gone while the block ran."""
        return self.held is not None and self.held.lost


class Hold(_Hold):
    """`with limiter.hold(key, limit, ttl_ms, wait=5) as lease:` — see `Limiter.hold`."""

    held: Optional[Held]

    def __enter__(self) -> Lease:
        deadline = None if self.wait is None else time.monotonic() + self.wait
        tries = 0
        while True:
            lease = self.limiter.lease(self.key, self.limit, self.ttl_ms, id=self.id)
            if lease.allowed:
                break
            time.sleep(_sleep_s(lease, deadline, time.monotonic(), self.wait, tries))
            tries += 1
        self.held = Held(self.limiter, lease, self.renew)
        return lease

    def __exit__(self, *exc: Any) -> None:
        if self.held is not None:
            self.held.close()


class AsyncHold(_Hold):
    """`async with limiter.hold(key, limit, ttl_ms, wait=5) as lease:` — see
    `redis_rl.asyncio.Limiter.hold`."""

    held: Optional[AsyncHeld]

    async def __aenter__(self) -> Lease:
        loop = asyncio.get_running_loop()
        deadline = None if self.wait is None else loop.time() + self.wait
        tries = 0
        while True:
            lease = await self._take()
            if lease.allowed:
                break
            await asyncio.sleep(_sleep_s(lease, deadline, loop.time(), self.wait, tries))
            tries += 1
        self.held = AsyncHeld(self.limiter, lease, self.renew)
        return lease

    async def _take(self) -> Lease:
        """One take that a cancellation cannot leave holding a slot: a lease taken while the
        caller was being cancelled is released before the cancellation goes on."""
        call = asyncio.ensure_future(self.limiter.lease(self.key, self.limit, self.ttl_ms, id=self.id))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            try:
                lease = await call
            except Exception:
                lease = None
            if lease is not None and lease.allowed:
                await self.limiter.release(lease.key, lease.id)
            raise

    async def __aexit__(self, *exc: Any) -> None:
        if self.held is not None:
            await self.held.close()
