"""The asyncio limiter, on `redis.asyncio.Redis` or `redis.asyncio.RedisCluster`.

The same API and rules as `redis_rl.Limiter` (see `redis_rl.client`), awaited: both run
`_core.Engine`, which decides everything but the I/O. Each call runs under `asyncio.wait_for`
with the limiter's deadline, whatever the client's own timeouts.

Busy is not down: calls beyond the client pool's `max_connections` queue here for a free
connection (a semaphore per event loop), and a pool that is full anyway (shared with other
work) is tried again until the deadline. Only then does the policy decide, logged as busy.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union
import weakref

from redis import exceptions as redis_errors

from ._core import (Busy, Engine, LimiterBase, MisconfiguredError, is_busy, is_unavailable,
                    misconfiguration, monotonic, refused)
from ._core import Charge, Decision, Item, Limit, MultiDecision, Number, Refund
from ._core import lease_params
from ._slots import Across, SlotItem, SlotsDecision
from .hold import AsyncHold
from .lease import AsyncReservation, Id, Lease, LeaseCount, Reservation

if TYPE_CHECKING:
    import redis.asyncio

    from .table import AsyncTable
from .client import RAW, _checked, _moved_on_cluster, _route, functions_text, functions_version, log


_OUTAGE = object()  # what `_queue` returns when an outage began while the call queued
#: The longest `check()` waits for its answers, in s.
CHECK_DEADLINE_S = 10.0


def connect(url: str, timeout_ms: float = 1000, **kwargs: Any) -> "redis.asyncio.Redis":
    """`redis.asyncio.Redis.from_url` with short timeouts and no retries: a client for a limiter."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(url, socket_timeout=timeout_ms / 1000,
                          socket_connect_timeout=timeout_ms / 1000, retry=Retry(NoBackoff(), 0), **kwargs)


def connect_cluster(url: str, timeout_ms: float = 1000, **kwargs: Any) -> "redis.asyncio.RedisCluster":
    """`redis.asyncio.RedisCluster.from_url` with short socket timeouts, for a limiter. It
    connects on first use: `await limiter.check()` then names a misconfiguration."""
    from redis.asyncio import RedisCluster

    return RedisCluster.from_url(url, socket_timeout=timeout_ms / 1000,
                                 socket_connect_timeout=timeout_ms / 1000, **kwargs)


async def load_functions(client: Any) -> int:
    """The awaited `redis_rl.load_functions`: FUNCTION LOAD REPLACE of the Functions library on
    the server of a `redis.asyncio.Redis`, or on every master of a
    `redis.asyncio.RedisCluster`; returns the version loaded."""
    text = functions_text()
    if hasattr(client, "get_primaries"):
        await client.initialize()
        for node in client.get_primaries():
            await node.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    else:
        await client.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    return functions_version(text)


class Limiter(LimiterBase):
    """The asyncio `redis_rl.Limiter`: the same options, methods and rules (see its
    docstring), awaited. `timeout_ms` (default 1000) is each call's deadline, enforced with
    asyncio.wait_for on every call, on any client: the wait for a free connection (calls
    beyond the pool's `max_connections` queue for one) and the reply together.
    """

    def __init__(self, client: Any, *, on_error: str, instances: int = 1,
                 deny_cache: Union[bool, int] = False, without_module: str = "lua",
                 timeout_ms: float = 1000, probe_interval_ms: float = 100,
                 local_max_keys: int = 100_000, clock: Callable[[], float] = monotonic) -> None:
        self._engine = Engine(on_error, instances, deny_cache, without_module, timeout_ms,
                              probe_interval_ms, local_max_keys, clock)
        self._engine.reservation_type = AsyncReservation
        self.client = client
        self._cluster = hasattr(client, "get_node_from_key")
        pool = getattr(client, "connection_pool", None)
        bound = getattr(pool, "max_connections", None)
        # An unbounded pool (redis-py 5.x's default, 2**31) never runs out: no queue needed.
        self._max_in_flight = bound if isinstance(bound, int) and 0 < bound <= 10_000 else None
        self._gates = weakref.WeakKeyDictionary()  # event loop -> asyncio.Semaphore

    async def check(self) -> Optional[str]:
        """The awaited `redis_rl.Limiter.check`: finds the path and returns it, raises
        MisconfiguredError for a misconfiguration, returns None (and logs a warning) while
        Redis is down or busy."""
        try:
            # A longer deadline than a call's: a client that retries a refused password (as
            # redis-py's default Retry does, for seconds) still gets to say why.
            return await asyncio.wait_for(self._drive(self._engine.check_steps(self._cluster)),
                                          max(self._engine.timeout_s, CHECK_DEADLINE_S))
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError,
                asyncio.TimeoutError) as error:
            return _checked(error, self._cluster)

    async def acquire(self, key: str, limit: Limit, cost: Number = 1) -> Decision:
        """Takes `cost` tokens from the bucket `key` of `limit`; returns a Decision."""
        return await self._run("acquire", [(key, limit, cost)])

    async def peek(self, key: str, limit: Limit, cost: Number = 1) -> Decision:
        """What `acquire` would decide for `cost`, taking nothing."""
        return await self._run("peek", [(key, limit, cost)])

    async def acquire_all(self, items: Iterable[Item]) -> MultiDecision:
        """All or nothing over [(key, limit)] or [(key, limit, cost)]: takes every bucket's
        cost if each holds it, else nothing. In a cluster every key must hash to one slot:
        give them one hash tag, as in "{user:42}:s" and "{user:42}:h"."""
        return await self._run("multi", items)

    async def acquire_across_slots(self, items: Iterable[Union[Item, SlotItem]]) -> SlotsDecision:
        """The awaited `redis_rl.Limiter.acquire_across_slots`: all or nothing over keys of any
        slots; returns a SlotsDecision."""
        plan = Across(self._engine, items)
        step, args = plan.start()
        while True:
            if step == "done":
                decision, error = args
                if error is not None:
                    raise error
                return decision
            if step == "ask":
                try:
                    step, args = plan.answer(await self.acquire_all(args))
                except (redis_errors.RedisError, redis_errors.RedisClusterException) as error:
                    step, args = plan.answer(None, error)
                continue
            for key, limit, cost in args:
                try:
                    await self.refund(key, limit, cost)
                except Exception as error:  # the call's answer stands; the refund is logged
                    log.warning("redis-rl: giving back %s after a refusal failed: %s", key, error)
            step, args = plan.refunded()

    async def charge(self, key: str, limit: Limit, cost: Number) -> Charge:
        """Applies `cost` tokens to the bucket `key` whatever it holds (post-paid: usage already
        done, such as the tokens of an answer), taking it into debt if need be: RL.CHARGE.
        While in debt every take is denied until `retry_after_ms` has passed. Returns a Charge
        whose `remaining` is the signed balance. Raises DebtTooLongError (a ValueError),
        changing nothing, when the bucket would not be full again within 100 years.

        When Redis cannot decide: "local" applies it to the local bucket; "open" and "closed"
        record it nowhere and say so (`applied` False, a warning naming the key and the cost,
        `counters["unapplied_charges"]`)."""
        return await self._run("charge", [(key, limit, cost)])

    async def refund(self, key: str, limit: Limit, cost: Number = 1) -> Refund:
        """Gives `cost` tokens back (a request that failed before doing any work) and clears
        the deny cache's entry for `key`."""
        return await self._run("refund", [(key, limit, cost)])

    def table(self, name: str, shards: Optional[int] = None,
              expected_buckets: Optional[int] = None) -> AsyncTable:
        """A bucket table of this limiter: `shards` tables `name:{0}` … (redis_rl.table).
        Without `shards`, enough for `expected_buckets` (`redis_rl.table.shards_for`: at most
        `MAX_BUCKETS_PER_TABLE` each), or 1. Both given and `shards` too few for the expected
        buckets: a warning on the `redis_rl` logger, and `shards` is used."""
        from .table import AsyncTable

        return AsyncTable(self, name, shards, expected_buckets)

    # Waiting --------------------------------------------------------------------------------

    async def wait(self, key: str, limit: Limit, cost: Number = 1,
                   timeout: Optional[float] = None) -> Decision:
        """The awaited `redis_rl.Limiter.wait`: takes `cost` tokens once the bucket holds them.
        Cancelling the task ends the wait holding no tokens (a take that raced the cancel is
        refunded before the CancelledError goes on). See `redis_rl.wait`."""
        from .wait import wait_async

        return await wait_async(self, key, limit, cost, timeout)

    # Leases and reservations ----------------------------------------------------------------

    async def lease(self, key: str, limit: int, ttl_ms: int, id: Optional[Id] = None) -> Lease:
        """Takes a lease on `key` (RL.LEASE) if fewer than `limit` are held, for `ttl_ms` unless
        released or renewed; `id` (1 to 16 bytes) makes a retried take idempotent. Returns a
        Lease. The failure policy decides while Redis cannot: "open" gives an "open:" lease that
        holds nothing, "closed" denies, "local" takes one in this process's lease table."""
        return await self._lease_call("lease", key, lease_params("lease", limit, ttl_ms, id))

    async def release(self, key: str, id: Id) -> bool:
        """Gives the lease `id` back (RL.RELEASE): True if it was held."""
        return await self._lease_call("release", key, lease_params("release", lease_id=id))

    async def renew(self, key: str, id: Id, ttl_ms: int) -> bool:
        """Makes the lease `id` expire `ttl_ms` from now (RL.RENEW): True if it was held."""
        return await self._lease_call("renew", key, lease_params("renew", ttl_ms=ttl_ms, lease_id=id))

    async def leases(self, key: str, limit: int) -> LeaseCount:
        """Counts the leases held on `key` (RL.LEASES), writing nothing: a LeaseCount."""
        return await self._lease_call("leases", key, lease_params("leases", limit))

    async def reserve(self, key: str, limit: Limit, estimate: Number, ttl_ms: int,
                      id: Optional[Id] = None) -> Reservation:
        """Takes `estimate` tokens from the bucket `key` now, as `acquire` takes a cost, and
        records the take as a reservation open for `ttl_ms` (RL.RESERVE); settle it with
        `reservation.settle(actual)` (awaited). A reservation never settled stands as taken."""
        reservation = await self._lease_call("reserve", key, lease_params(
            "reserve", ttl_ms=ttl_ms, lease_id=id, bucket=limit, estimate=estimate))
        reservation._limiter = self
        return reservation

    async def settle(self, key: str, limit: Limit, id: Id, actual: Number) -> Charge:
        """Settles the open reservation `id` with the `actual` cost (RL.SETTLE): what was
        over-estimated goes back, what was under-estimated is charged (into debt). Returns a
        Charge (signed balance). A second settle of an id raises ReservationNotOpenError."""
        return await self._lease_call("settle", key, lease_params(
            "settle", lease_id=id, bucket=limit, actual=actual))

    def hold(self, key: str, limit: int, ttl_ms: int, wait: Optional[float] = 0, *,
             id: Optional[Id] = None, renew: bool = True) -> AsyncHold:
        """A lease as a scope: `async with limiter.hold(key, limit, ttl_ms, wait=5) as lease:`
        takes a lease, trying again until `wait` seconds have passed (0: one try; None: no
        limit), then raises LeaseTimeoutError; a try waits at most the denial's
        retry_after_ms (when the earliest lease expires) and, since a release frees a slot
        sooner, polls from 5 ms doubling up to 1 s; renews it every ttl_ms / 2 while the
        block runs (an asyncio task; `renew=False` does not); and
        releases it when the block ends, by an exception included."""
        return AsyncHold(self, key, limit, ttl_ms, wait, id, renew)

    async def _lease_call(self, op, key, params):
        return await self._complete(*self._engine.begin_lease(op, key, params))

    # The I/O --------------------------------------------------------------------------------

    async def _run(self, op, items):
        return await self._complete(*self._engine.begin(op, items))

    async def _complete(self, answer, call):
        """The answer of a call `engine.begin` (or `begin_lease`) started."""
        engine, op = self._engine, call.op if call is not None else None
        if call is None:
            return answer
        queued = [True]  # still waiting for a connection (busy) rather than for Redis
        try:
            reply = await asyncio.wait_for(self._queue(engine.exchange(call), queued), engine.timeout_s)
            if reply is _OUTAGE:
                return engine.policy(op, call.items)
        except MisconfiguredError as error:
            return engine.misconfigured(call, error)
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError,
                asyncio.TimeoutError) as error:
            if isinstance(error, asyncio.TimeoutError) and queued[0]:
                error = Busy(f"no free connection within {round(engine.timeout_s * 1000)} ms")
            cause = misconfiguration(error, self._cluster)
            if cause is not None:
                return engine.misconfigured(call, MisconfiguredError(cause))
            if not (is_unavailable(error) or _moved_on_cluster(error, self._cluster)):
                raise refused(error)
            return engine.fail(call, error)
        return engine.finish(call, reply)

    def _gate(self):
        """This event loop's queue for a connection, or None when the pool has no bound."""
        if self._max_in_flight is None:
            return None
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self._max_in_flight)
        return gate

    async def _queue(self, steps, queued):
        gate = self._gate()
        if gate is None:
            return await self._drive(steps, queued)
        async with gate:
            # An outage that began while this call queued decides it as it decides new calls.
            if self._engine.skip_redis():
                return _OUTAGE
            return await self._drive(steps, queued)

    async def _drive(self, steps, queued=None):
        """Runs the requests of `engine.exchange` until it returns the reply."""
        advance, value = steps.send, None
        while True:
            try:
                request = advance(value)
            except StopIteration as done:
                return done.value
            try:
                advance, value = steps.send, await self._send(request, queued)
            except Exception as error:  # the engine handles what it knows, and re-raises the rest
                advance, value = steps.throw, error

    async def _send(self, request, queued):
        """`_execute`, again after a short sleep while the pool is full (a client shared with
        other work): the deadline of `_run` ends the waiting."""
        pause, queued = 0.002, queued if queued is not None else [False]
        while True:
            queued[0] = False
            try:
                return await self._execute(request)
            except (redis_errors.ConnectionError, redis_errors.RedisClusterException) as error:
                if not is_busy(error):
                    raise
            queued[0] = True
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.05)

    async def _execute(self, request):
        client, args = self.client, request.args
        options = RAW if request.raw else {}
        if not self._cluster:
            return await client.execute_command(*args, **options)
        await client.initialize()  # an asyncio cluster client learns its nodes here
        route = _route(client, request)
        if route == "direct":
            # redis-py's cluster client refuses a command name with two dots
            # (RL.ACQUIRE.MULTI), and keys of several slots: sent to the first key's node,
            # whose server answers (CROSSSLOT for several slots).
            return await client.get_node_from_key(request.keys[0]).execute_command(*args, **options)
        return await client.execute_command(*args, target_nodes=client.get_node_from_key(request.keys[0]),
                                            **options)
