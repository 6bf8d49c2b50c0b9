"""The exact token bucket in process: the `local` failure policy's decisions.

Pure functions of the old state and the time, in exact rationals (fractions.Fraction), with
the module's semantics (README "How it works"): a bucket is the instant `full_at_ns` when it is
full; with T = 1e9 / rate ns per token, tokens(now) = capacity - max(0, full_at - now) / T.
The rate, capacity and cost are the exact values of the decimals the module is sent (0.1 is
one tenth; see `_decimal`). Nothing here reads a clock or imports redis; `LocalBuckets` adds a
bounded store on top.

Checked against clients/vectors/bucket.json, the vectors the module's bucket is held to.
"""

from collections import OrderedDict
from fractions import Fraction
from math import ceil, floor

from ._decimal import exact

NS_PER_S = 10**9
NS_PER_MS = 10**6
NS_PER_US = 1000

#: `refund` returns this as the new state when the bucket is full again (delete the key).
FULL = None


def _ms_ceil(ns):
    return ceil(ns / NS_PER_MS)


def _debt(full_at_ns, now_ns):
    if full_at_ns is None or full_at_ns <= now_ns:
        return Fraction(0)
    return full_at_ns - now_ns


def _remaining(rate, capacity, debt_ns):
    return max(0, floor(capacity - debt_ns * rate / NS_PER_S))


def acquire(rate, capacity, full_at_ns, now_us, cost, take=True):
    """Takes `cost` tokens at `now_us` if the bucket holds them (only looks when not `take`).

    `rate`, `capacity` and `cost` are Fractions; `full_at_ns` is the state (a Fraction, or
    None for a missing key, a full bucket). Returns `((allowed, remaining, retry_after_ms,
    reset_after_ms), new_full_at_ns)`, where the new state is `full_at_ns` itself when the
    call changes nothing (a denial, a peek, or cost 0).
    """
    now_ns = now_us * NS_PER_US
    debt = _debt(full_at_ns, now_ns)
    if cost > capacity:
        return (0, _remaining(rate, capacity, debt), -1, _ms_ceil(debt)), full_at_ns
    t_ns = NS_PER_S / rate
    slack = (capacity - cost) * t_ns
    if debt > slack:
        return (0, _remaining(rate, capacity, debt), _ms_ceil(debt - slack), _ms_ceil(debt)), full_at_ns
    if not take or cost == 0:
        return (1, _remaining(rate, capacity, debt), 0, _ms_ceil(debt)), full_at_ns
    new_full_at = max(full_at_ns or 0, now_ns) + cost * t_ns
    debt = new_full_at - now_ns
    return (1, _remaining(rate, capacity, debt), 0, _ms_ceil(debt)), new_full_at


def refund(rate, capacity, full_at_ns, now_us, cost):
    """Gives `cost` tokens back, capped at capacity. Returns `((remaining, reset_after_ms),
    new_full_at_ns)`, the new state being `FULL` (None) once the bucket is full again."""
    now_ns = now_us * NS_PER_US
    # At most the capacity comes back, as the module caps it (a charge can owe more).
    debt = max(Fraction(0), _debt(full_at_ns, now_ns) - min(cost, capacity) * NS_PER_S / rate)
    new_full_at = FULL if debt == 0 else now_ns + debt
    return (_remaining(rate, capacity, debt), _ms_ceil(debt)), new_full_at


class LocalBuckets:
    """Buckets of `rate / instances` and `capacity / instances` per key, in memory.

    At most `max_keys` buckets are kept, least recently used first out. Forgetting a bucket
    makes it full again, so the bound trades strictness for memory only once more than
    `max_keys` keys are limited within one refill time. Not thread-safe: the caller locks.
    """

    def __init__(self, instances, max_keys=100_000):
        if not isinstance(instances, int) or instances < 1:
            raise ValueError("instances must be an integer >= 1")
        if not isinstance(max_keys, int) or max_keys < 1:
            raise ValueError("max_keys must be an integer >= 1")
        self.instances = instances
        self.max_keys = max_keys
        self._full_at = OrderedDict()

    def __len__(self):
        return len(self._full_at)

    def _share(self, limit):
        return limit.rate_fraction / self.instances, limit.capacity_fraction / self.instances

    def _store(self, key, full_at_ns):
        if full_at_ns is None:
            self._full_at.pop(key, None)
            return
        self._full_at[key] = full_at_ns
        self._full_at.move_to_end(key)
        while len(self._full_at) > self.max_keys:
            self._full_at.popitem(last=False)

    def acquire(self, key, limit, cost, now_us, take=True):
        rate, capacity = self._share(limit)
        old = self._full_at.get(key)
        reply, new = acquire(rate, capacity, old, now_us, exact(cost), take)
        if new is not old:
            self._store(key, new)
        return reply

    def acquire_all(self, items, now_us):
        """All or nothing over [(key, limit, cost)]: the module's RL.ACQUIRE.MULTI reply."""
        pending = {}
        replies = []
        for key, limit, cost in items:
            rate, capacity = self._share(limit)
            old = pending[key] if key in pending else self._full_at.get(key)
            reply, new = acquire(rate, capacity, old, now_us, exact(cost))
            pending[key] = new
            replies.append(reply)
        refused = [i for i, r in enumerate(replies) if not r[0]]
        if refused:
            waits = [replies[i][2] for i in refused]
            retry = -1 if min(waits) < 0 else max(waits)
            return 0, refused[0], retry, replies
        for key, new in pending.items():
            if new is not self._full_at.get(key):
                self._store(key, new)
        return 1, -1, 0, replies

    def forget(self, key):
        """Drops the bucket of `key`: it is full again (a table's delete)."""
        self._full_at.pop(key, None)

    def refund(self, key, limit, cost, now_us):
        rate, capacity = self._share(limit)
        old = self._full_at.get(key)
        reply, new = refund(rate, capacity, old, now_us, exact(cost))
        if old is not None or new is not None:
            self._store(key, new)
        return reply
