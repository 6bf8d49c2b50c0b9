"""Waiting for tokens: `Limiter.wait` and `redis_rl.asyncio.Limiter.wait` (outbound
throttling: take your turn instead of a 429).

Built only on the limiter's public `acquire` and `refund`, so the failure policy, the deny
cache and the Lua fallback apply to each try unchanged. Each denied try sleeps the
`retry_after_ms` the bucket returned plus up to 10% jitter (never less than 1 ms), so waiters
on one bucket wake just after a token appears, do not stampede together, and never spin.
"""

import asyncio
import random
import threading
import time
from typing import Any, Optional

from ._core import Error

#: The jitter added to each sleep, as a fraction of the wait the bucket returned.
JITTER = 0.1
# A denial that says "no wait" (it cannot come from the bucket) still must not spin.
_MIN_SLEEP_S = 0.001


class WaitTimeoutError(Error):
    """`wait` gave up at its timeout; `decision` is the last denial."""

    def __init__(self, decision, timeout_s):
        super().__init__(f"no token within {timeout_s:g} s (last retry_after_ms="
                         f"{decision.retry_after_ms})")
        self.decision = decision


class WaitNeverError(Error):
    """The cost exceeds the limit's capacity (retry_after_ms = -1): no wait can help."""

    def __init__(self, decision):
        super().__init__(f"cost can never be taken: it exceeds the capacity of {decision.limit!r}")
        self.decision = decision


class WaitCancelledError(Error):
    """The sync `wait` saw its `cancel` event set; it holds no tokens."""


def _next_sleep_s(decision, deadline, now, timeout):
    """After a denial: the sleep before the next try, or the error to raise."""
    if decision.retry_after_ms < 0:
        raise WaitNeverError(decision)
    sleep_s = max(_MIN_SLEEP_S, decision.retry_after_ms / 1000 * (1 + random.uniform(0, JITTER)))
    if deadline is None:
        return sleep_s
    left_s = deadline - now
    if left_s <= 0:
        raise WaitTimeoutError(decision, timeout)
    return min(sleep_s, left_s)  # sleep to the deadline at most, then try once more there


def _check(timeout):
    if timeout is not None and not timeout >= 0:
        raise ValueError("timeout must be None or a number of seconds >= 0")


def wait(limiter: Any, key: str, limit: Any, cost: Any = 1, timeout: Optional[float] = None,
         cancel: Optional[threading.Event] = None) -> Any:
    """The sync wait: see `redis_rl.Limiter.wait`."""
    _check(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    cancel = cancel if cancel is not None else threading.Event()
    while True:
        if cancel.is_set():
            raise WaitCancelledError("wait cancelled")
        decision = limiter.acquire(key, limit, cost)
        if decision.allowed:
            return decision
        cancel.wait(_next_sleep_s(decision, deadline, time.monotonic(), timeout))


async def wait_async(limiter: Any, key: str, limit: Any, cost: Any = 1,
                     timeout: Optional[float] = None) -> Any:
    """The asyncio wait: see `redis_rl.asyncio.Limiter.wait`."""
    _check(timeout)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        decision = await _acquire_or_give_back(limiter, key, limit, cost)
        if decision.allowed:
            return decision
        await asyncio.sleep(_next_sleep_s(decision, deadline, loop.time(), timeout))


async def _acquire_or_give_back(limiter, key, limit, cost):
    """One acquire that a cancellation cannot leave holding tokens: when the caller is
    cancelled while the call is in flight, the call is let finish (within the limiter's own
    deadline) and, if it took the tokens, they are refunded before the cancellation goes on."""
    call = asyncio.ensure_future(limiter.acquire(key, limit, cost))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        try:
            decision = await call
        except Exception:  # the call failed: it took nothing
            decision = None
        if decision is not None and decision.allowed:
            await limiter.refund(key, limit, cost)
        raise
