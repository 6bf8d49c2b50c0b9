"""The synchronous limiter, on redis-py's `Redis` or `RedisCluster`.

Only the I/O lives here: `_core.Engine` decides everything before and after a call (the
deny cache, the failure policy, the replies) and names each request a call makes; this class
sends them with redis-py. The asyncio twin is `redis_rl.asyncio`, the same over awaits.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Union

from redis import exceptions as redis_errors
from redis.client import NEVER_DECODE

#: The options of a command whose reply is read as bytes, whatever the client's
#: decode_responses: the script's packed reply (`Request.raw`).
RAW = {NEVER_DECODE: True}

from ._core import (Engine, LimiterBase, MisconfiguredError, is_cluster_redirect, is_crossslot,
                    is_unavailable,
                    misconfiguration, monotonic, refused)
from ._core import Charge, Decision, Item, Limit, MultiDecision, Number, Refund
from ._core import lease_params
from ._slots import Across, SlotItem, SlotsDecision
from .hold import Hold
from .lease import Id, Lease, LeaseCount, Reservation

if TYPE_CHECKING:
    import redis

    from .table import Table

log = logging.getLogger("redis_rl")


# The pool a limiter makes when the client's own has no useful bound (redis-py 5.x: 2**31).
DEFAULT_MAX_CONNECTIONS = 100


def with_deadline(client: Any, timeout_ms: float) -> Any:
    """A `redis.Redis` on a pool of its own: the client's settings, with `timeout_ms` as the
    socket and connect timeouts and no retries, on a `BlockingConnectionPool` of the client's
    `max_connections` (100 when it has no bound below 10,000) that waits up to `timeout_ms`
    for a free connection. A full pool is load, not an outage: a call waits for a connection
    rather than failing at once (redis-py's `ConnectionPool` raises `MaxConnectionsError`).
    A cluster client is returned as it is: give it timeouts yourself (see `connect_cluster`)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.Redis) or pool is None:
        return client
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(socket_timeout=timeout_ms / 1000, socket_connect_timeout=timeout_ms / 1000,
                  retry=Retry(NoBackoff(), 0), retry_on_timeout=False)
    kwargs.pop("retry_on_error", None)
    max_connections = getattr(pool, "max_connections", None)
    if not isinstance(max_connections, int) or not 0 < max_connections <= 10_000:
        max_connections = DEFAULT_MAX_CONNECTIONS
    return redis.Redis(connection_pool=redis.BlockingConnectionPool(
        connection_class=pool.connection_class, max_connections=max_connections,
        timeout=timeout_ms / 1000, **kwargs))


def connect(url: str, timeout_ms: float = 1000, **kwargs: Any) -> "redis.Redis":
    """`redis.Redis.from_url` with short timeouts and no retries: a client for a limiter."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, socket_timeout=timeout_ms / 1000,
                                socket_connect_timeout=timeout_ms / 1000,
                                retry=Retry(NoBackoff(), 0), **kwargs)


def connect_cluster(url: str, timeout_ms: float = 1000, **kwargs: Any) -> "redis.RedisCluster":
    """`redis.RedisCluster.from_url` with short socket timeouts, for a limiter. redis-py's
    cluster client reads the slots (and the server's command table, with COMMAND) as it is
    built: a server that is not a cluster, a wrong password or a missing permission raise
    MisconfiguredError here, naming the cause."""
    import redis

    try:
        return redis.RedisCluster.from_url(url, socket_timeout=timeout_ms / 1000,
                                           socket_connect_timeout=timeout_ms / 1000, **kwargs)
    except (redis_errors.RedisError, redis_errors.RedisClusterException) as error:
        cause = misconfiguration(error, True)
        if cause is not None:
            raise MisconfiguredError(cause) from error
        raise


#: The Functions library's version, as its text declares it (`local VERSION = 1`).
_VERSION = re.compile(r"^local VERSION = (\d+)$", re.MULTILINE)


def functions_text() -> str:
    """The Functions library shipped in the package (a copy of clients/lua/rl_functions.lua)."""
    from importlib import resources

    return resources.files(__package__).joinpath("rl_functions.lua").read_text()


def functions_version(text: str) -> int:
    match = _VERSION.search(text)
    if match is None:
        raise ValueError("the Functions library declares no VERSION")
    return int(match.group(1))


def load_functions(client: Any) -> int:
    """Loads the Functions library redis_rl (FUNCTION LOAD REPLACE) on the server of a
    `redis.Redis`, or on every master of a `redis.RedisCluster`; returns the version loaded.
    An admin's call, once per deployment and again after FUNCTION FLUSH: the user needs
    `+function|load +function|list` (docs/clients.md#permissions)."""
    text = functions_text()
    if hasattr(client, "get_primaries"):
        for node in client.get_primaries():
            node.redis_connection.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    else:
        client.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    return functions_version(text)


class Limiter(LimiterBase):
    """Rate limits on Redis with the redis-rl module (or its Lua fallback), with an explicit
    failure policy.

    - `on_error` (required): what to decide when Redis cannot (connection errors, timeouts,
      OOM, READONLY and LOADING replies): "open" allows, "closed" denies, "local" decides in
      process with an exact bucket of rate / instances and capacity / instances per key.
    - `instances`: how many processes share the limit (for "local"); default 1.
    - `deny_cache`: the hot-key shield. After Redis denies (key, cost) with retry_after_ms = R,
      answer that key as denied locally for R, for any cost at least as large. True (10,000
      entries), False, or the number of entries to keep.
    - `without_module` (default "lua"): on a server without the module, use the Functions
      library redis_rl when it is loaded, else the shipped Lua script ("lua"), or take the
      module only ("refuse": without it `check()` raises ModuleMissingError and calls are
      misconfigured). The path is found by sending the call and reading the error, with no
      privileged command (`path` says which).
    - `timeout_ms` (default 1000): each call's deadline, the longest it waits for Redis: for a
      free connection in the pool, for a connection to open, for the reply. Busy is not down:
      a full pool or a slow reply under load is waited for, and only a call still without an
      answer at the deadline is decided by the policy (logged as busy, or as an outage when
      Redis refused, reset or did not answer). A `redis.Redis` client is copied onto a
      `BlockingConnectionPool` of its own with that deadline as the socket, connect and pool
      timeouts and no retries; a cluster client keeps its own timeouts.
    - `probe_interval_ms` (default 100): during an outage, Redis is tried again at most this
      often; the calls in between are decided by the policy at once.
    - `local_max_keys` (default 100,000): the most buckets "local" keeps (least recently used
      out).

    `counters` counts decisions by source, and outages, busy and misconfigured calls. Call
    `check()` once at startup: it raises MisconfiguredError for a mistake to fix.
    """

    def __init__(self, client: Any, *, on_error: str, instances: int = 1,
                 deny_cache: Union[bool, int] = False, without_module: str = "lua",
                 timeout_ms: float = 1000, probe_interval_ms: float = 100,
                 local_max_keys: int = 100_000, clock: Callable[[], float] = monotonic) -> None:
        self._engine = Engine(on_error, instances, deny_cache, without_module, timeout_ms,
                              probe_interval_ms, local_max_keys, clock)
        self.client = with_deadline(client, timeout_ms)
        self._cluster = hasattr(self.client, "get_node_from_key")

    def check(self) -> Optional[str]:
        """The startup check: contacts Redis, finds the path and returns it ("module",
        "functions" or "lua"). Raises MisconfiguredError (ModuleMissingError under
        without_module="refuse") for a wrong password, a missing permission (naming the
        command and the ACL rule to add), a cluster client on a server that is not a cluster
        or a plain client on a cluster. While Redis is down or busy it raises nothing: it logs
        a warning and returns None, and the failure policy decides the calls meanwhile."""
        try:
            return self._drive(self._engine.check_steps(self._cluster))
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as error:
            return _checked(error, self._cluster)

    def acquire(self, key: str, limit: Limit, cost: Number = 1) -> Decision:
        """Takes `cost` tokens from the bucket `key` of `limit`; returns a Decision."""
        return self._run("acquire", [(key, limit, cost)])

    def peek(self, key: str, limit: Limit, cost: Number = 1) -> Decision:
        """What `acquire` would decide for `cost`, taking nothing."""
        return self._run("peek", [(key, limit, cost)])

    def acquire_all(self, items: Iterable[Item]) -> MultiDecision:
        """All or nothing over [(key, limit)] or [(key, limit, cost)]: takes every bucket's
        cost if each holds it, else nothing. In a cluster every key must hash to one slot:
        give them one hash tag, as in "{user:42}:s" and "{user:42}:h"."""
        return self._run("multi", items)

    def acquire_across_slots(self, items: Iterable[Union[Item, SlotItem]]) -> SlotsDecision:
        """All or nothing over [(key, limit)], [(key, limit, cost)] or `SlotItem`s whose keys
        may sit in different slots of a cluster: one `acquire_all` on one server; on a cluster
        one per slot, in slot order, refunding the slots already taken when a later one refuses
        or fails. Returns a SlotsDecision (one SlotOutcome per item); a shadow item's refusal
        is reported but refuses nothing. See `redis_rl._slots`."""
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
                    step, args = plan.answer(self.acquire_all(args))
                except (redis_errors.RedisError, redis_errors.RedisClusterException) as error:
                    step, args = plan.answer(None, error)
                continue
            for key, limit, cost in args:
                try:
                    self.refund(key, limit, cost)
                except Exception as error:  # the call's answer stands; the refund is logged
                    log.warning("redis-rl: giving back %s after a refusal failed: %s", key, error)
            step, args = plan.refunded()

    def charge(self, key: str, limit: Limit, cost: Number) -> Charge:
        """Applies `cost` tokens to the bucket `key` whatever it holds (post-paid: usage already
        done, such as the tokens of an answer), taking it into debt if need be: RL.CHARGE.
        While in debt every take is denied until `retry_after_ms` has passed. Returns a Charge
        whose `remaining` is the signed balance. Raises DebtTooLongError (a ValueError),
        changing nothing, when the bucket would not be full again within 100 years.

        When Redis cannot decide: "local" applies it to the local bucket; "open" and "closed"
        record it nowhere and say so (`applied` False, a warning naming the key and the cost,
        `counters["unapplied_charges"]`)."""
        return self._run("charge", [(key, limit, cost)])

    def refund(self, key: str, limit: Limit, cost: Number = 1) -> Refund:
        """Gives `cost` tokens back (a request that failed before doing any work) and clears
        the deny cache's entry for `key`."""
        return self._run("refund", [(key, limit, cost)])

    def table(self, name: str, shards: Optional[int] = None,
              expected_buckets: Optional[int] = None) -> Table:
        """A bucket table of this limiter: `shards` tables `name:{0}` … (redis_rl.table).
        Without `shards`, enough for `expected_buckets` (`redis_rl.table.shards_for`: at most
        `MAX_BUCKETS_PER_TABLE` each), or 1. Both given and `shards` too few for the expected
        buckets: a warning on the `redis_rl` logger, and `shards` is used."""
        from .table import Table

        return Table(self, name, shards, expected_buckets)

    # Waiting --------------------------------------------------------------------------------

    def wait(self, key: str, limit: Limit, cost: Number = 1, timeout: Optional[float] = None, *,
             cancel: Optional[threading.Event] = None) -> Decision:
        """Takes `cost` tokens, sleeping between tries until the bucket holds them; returns the
        allowed Decision. Raises WaitTimeoutError (with the last denial) after `timeout`
        seconds (None: no limit), WaitNeverError at once when cost exceeds the capacity, and
        WaitCancelledError, holding no tokens, once the threading.Event `cancel` is set. The
        failure policy decides each try while Redis is down. See `redis_rl.wait`."""
        from .wait import wait

        return wait(self, key, limit, cost, timeout, cancel)

    # Leases and reservations ----------------------------------------------------------------

    def lease(self, key: str, limit: int, ttl_ms: int, id: Optional[Id] = None) -> Lease:
        """Takes a lease on `key` (RL.LEASE) if fewer than `limit` are held, for `ttl_ms` unless
        released or renewed; `id` (1 to 16 bytes) makes a retried take idempotent. Returns a
        Lease. The failure policy decides while Redis cannot: "open" gives an "open:" lease that
        holds nothing, "closed" denies, "local" takes one in this process's lease table."""
        return self._lease_call("lease", key, lease_params("lease", limit, ttl_ms, id))

    def release(self, key: str, id: Id) -> bool:
        """Gives the lease `id` back (RL.RELEASE): True if it was held."""
        return self._lease_call("release", key, lease_params("release", lease_id=id))

    def renew(self, key: str, id: Id, ttl_ms: int) -> bool:
        """Makes the lease `id` expire `ttl_ms` from now (RL.RENEW): True if it was held."""
        return self._lease_call("renew", key, lease_params("renew", ttl_ms=ttl_ms, lease_id=id))

    def leases(self, key: str, limit: int) -> LeaseCount:
        """Counts the leases held on `key` (RL.LEASES), writing nothing: a LeaseCount."""
        return self._lease_call("leases", key, lease_params("leases", limit))

    def reserve(self, key: str, limit: Limit, estimate: Number, ttl_ms: int,
                id: Optional[Id] = None) -> Reservation:
        """Takes `estimate` tokens from the bucket `key` now, as `acquire` takes a cost, and
        records the take as a reservation open for `ttl_ms` (RL.RESERVE); settle it with
        `reservation.settle(actual)`. A reservation never settled stands as taken."""
        reservation = self._lease_call("reserve", key, lease_params(
            "reserve", ttl_ms=ttl_ms, lease_id=id, bucket=limit, estimate=estimate))
        reservation._limiter = self
        return reservation

    def settle(self, key: str, limit: Limit, id: Id, actual: Number) -> Charge:
        """Settles the open reservation `id` with the `actual` cost (RL.SETTLE): what was
        over-estimated goes back, what was under-estimated is charged (into debt). Returns a
        Charge (signed balance). A second settle of an id raises ReservationNotOpenError."""
        return self._lease_call("settle", key, lease_params(
            "settle", lease_id=id, bucket=limit, actual=actual))

    def hold(self, key: str, limit: int, ttl_ms: int, wait: Optional[float] = 0, *,
             id: Optional[Id] = None, renew: bool = True) -> Hold:
        """A lease as a scope: `with limiter.hold(key, limit, ttl_ms, wait=5) as lease:`
        takes a lease, trying again until `wait` seconds have passed (0: one try; None: no
        limit), then raises LeaseTimeoutError; a try waits at most the denial's
        retry_after_ms (when the earliest lease expires) and, since a release frees a slot
        sooner, polls from 5 ms doubling up to 1 s; renews it every ttl_ms / 2 while the
        block runs (a daemon thread; `renew=False` does not); and
        releases it when the block ends, by an exception included."""
        return Hold(self, key, limit, ttl_ms, wait, id, renew)

    def _lease_call(self, op, key, params):
        return self._complete(*self._engine.begin_lease(op, key, params))

    # The I/O --------------------------------------------------------------------------------

    def _run(self, op, items):
        return self._complete(*self._engine.begin(op, items))

    def _complete(self, answer, call):
        """The answer of a call `engine.begin` (or `begin_lease`) started."""
        engine = self._engine
        if call is None:
            return answer
        try:
            reply = self._drive(engine.exchange(call))
        except MisconfiguredError as error:
            return engine.misconfigured(call, error)
        except (redis_errors.RedisError, redis_errors.RedisClusterException) as error:
            cause = misconfiguration(error, self._cluster)
            if cause is not None:
                return engine.misconfigured(call, MisconfiguredError(cause))
            if not (is_unavailable(error) or _moved_on_cluster(error, self._cluster)):
                raise refused(error)
            return engine.fail(call, error)
        return engine.finish(call, reply)

    def _drive(self, steps):
        """Runs the requests of `engine.exchange` until it returns the reply."""
        advance, value = steps.send, None
        while True:
            try:
                request = advance(value)
            except StopIteration as done:
                return done.value
            try:
                advance, value = steps.send, self._execute(request)
            except Exception as error:  # the engine handles what it knows, and re-raises the rest
                advance, value = steps.throw, error

    def _execute(self, request):
        client, args = self.client, request.args
        options = RAW if request.raw else {}
        if not self._cluster:
            return client.execute_command(*args, **options)
        route = _route(client, request)
        if route == "direct":
            # On the node's own connection: redis-py's cluster client refuses a command name
            # with two dots (RL.ACQUIRE.MULTI), and keys of several slots (the server answers
            # CROSSSLOT, as it does for a client of one server).
            node = client.get_node_from_key(request.keys[0])
            return node.redis_connection.execute_command(*args, **options)
        return client.execute_command(*args, target_nodes=client.get_node_from_key(request.keys[0]), **options)


def _route(client, request):
    """How a cluster client sends `request` (see `_core.Request`): "direct" or "node"."""
    if request.direct or len({client.keyslot(key) for key in request.keys}) > 1:
        return "direct"
    return "node"


def _moved_on_cluster(error, cluster):
    """A redirect met by a cluster client's request sent to one node (a failover or a slot
    migration under way): Redis cannot decide this call now; the client's own routing learns
    the new map on its next redirect."""
    return cluster and is_cluster_redirect(error) and not is_crossslot(error)


def _checked(error, cluster):
    """What `check()` makes of an error: MisconfiguredError for a misconfiguration, None (and
    a warning) when Redis is down or busy, the error itself otherwise."""
    cause = misconfiguration(error, cluster)
    if cause is not None:
        raise MisconfiguredError(cause) from error
    if is_unavailable(error):
        log.warning("redis-rl: check: Redis cannot answer now (%s: %s); the failure policy "
                    "decides until it does", type(error).__name__, error)
        return None
    raise refused(error)
