"""The asyncio limiter, on `redis.asyncio.Redis` or `redis.asyncio.RedisCluster`.

The same API and rules as `redis_rl.Limiter` (see `redis_rl.client`), awaited: both run
`_core.Engine`, which decides everything but the I/O. Each call runs under `asyncio.wait_for`
with the limiter's deadline, whatever the client's own timeouts.
"""

import asyncio

from redis import exceptions as redis_errors

from ._core import Engine, LimiterBase, is_unavailable, monotonic


def connect(url, timeout_ms=50, **kwargs):
    """`redis.asyncio.Redis.from_url` with short timeouts and no retries: a client for a limiter."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(url, socket_timeout=timeout_ms / 1000,
                          socket_connect_timeout=timeout_ms / 1000, retry=Retry(NoBackoff(), 0), **kwargs)


def connect_cluster(url, timeout_ms=50, **kwargs):
    """`redis.asyncio.RedisCluster.from_url` with short socket timeouts, for a limiter."""
    from redis.asyncio import RedisCluster

    return RedisCluster.from_url(url, socket_timeout=timeout_ms / 1000,
                                 socket_connect_timeout=timeout_ms / 1000, **kwargs)


class Limiter(LimiterBase):
    """The asyncio `redis_rl.Limiter`: the same options, methods and rules (see its
    docstring), awaited. `timeout_ms` (default 50) is each call's deadline, enforced with
    asyncio.wait_for on every call, on any client.
    """

    def __init__(self, client, *, on_error, instances=1, deny_cache=False, without_module="lua",
                 timeout_ms=50, probe_interval_ms=100, local_max_keys=100_000, clock=monotonic):
        self._engine = Engine(on_error, instances, deny_cache, without_module, timeout_ms,
                              probe_interval_ms, local_max_keys, clock)
        self.client = client

    async def acquire(self, key, limit, cost=1):
        """Takes `cost` tokens from the bucket `key` of `limit`; returns a Decision."""
        return await self._run("acquire", [(key, limit, cost)])

    async def peek(self, key, limit, cost=1):
        """What `acquire` would decide for `cost`, taking nothing."""
        return await self._run("peek", [(key, limit, cost)])

    async def acquire_all(self, items):
        """All or nothing over [(key, limit)] or [(key, limit, cost)]: takes every bucket's
        cost if each holds it, else nothing. In a cluster every key must hash to one slot:
        give them one hash tag, as in "{user:42}:s" and "{user:42}:h"."""
        return await self._run("multi", items)

    async def refund(self, key, limit, cost=1):
        """Gives `cost` tokens back (a request that failed before doing any work) and clears
        the deny cache's entry for `key`."""
        return await self._run("refund", [(key, limit, cost)])

    def table(self, name, shards=1):
        """A bucket table of this limiter: `shards` tables `name:{0}` … (redis_rl.table)."""
        from .table import AsyncTable

        return AsyncTable(self, name, shards)

    # Waiting --------------------------------------------------------------------------------

    async def wait(self, key, limit, cost=1, timeout=None):
        """The awaited `redis_rl.Limiter.wait`: takes `cost` tokens once the bucket holds them.
        Cancelling the task ends the wait holding no tokens (a take that raced the cancel is
        refunded before the CancelledError goes on). See `redis_rl.wait`."""
        from .wait import wait_async

        return await wait_async(self, key, limit, cost, timeout)

    # The I/O --------------------------------------------------------------------------------

    async def _run(self, op, items):
        engine = self._engine
        answer, call = engine.begin(op, items)
        if call is None:
            return answer
        try:
            reply = await asyncio.wait_for(self._drive(engine.exchange(call)), engine.timeout_s)
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError,
                asyncio.TimeoutError) as error:
            if not is_unavailable(error):
                raise
            return engine.fail(call, error)
        return engine.finish(call, reply)

    async def _drive(self, steps):
        """Runs the requests of `engine.exchange` until it returns the reply."""
        advance, value = steps.send, None
        while True:
            try:
                request = advance(value)
            except StopIteration as done:
                return done.value
            try:
                advance, value = steps.send, await self._execute(request)
            except Exception as error:  # the engine handles what it knows, and re-raises the rest
                advance, value = steps.throw, error

    async def _execute(self, request):
        client = self.client
        if request.kind == "detect":
            # A cluster client needs a node for a command without keys: any one will do.
            options = {}
            if hasattr(client, "get_random_node"):
                await client.initialize()  # an asyncio cluster client learns its nodes here
                options = {"target_nodes": client.get_random_node()}
            return await client.execute_command("COMMAND INFO", "RL.ACQUIRE", **options)
        if request.kind == "load":
            return await client.script_load(*request.args)
        if request.multi and hasattr(client, "get_node_from_key"):
            # redis-py's cluster client refuses a command name with two dots
            # (RL.ACQUIRE.MULTI), so send it to the node that owns the first key's slot.
            return await client.get_node_from_key(request.first_key).execute_command(*request.args)
        return await client.execute_command(*request.args)
