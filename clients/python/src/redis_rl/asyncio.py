"""The asyncio limiter, on `redis.asyncio.Redis` or `redis.asyncio.RedisCluster`.

The same API and rules as `redis_rl.Limiter` (see `redis_rl.client`), awaited. Each call runs
under `asyncio.wait_for` with the limiter's deadline, whatever the client's own timeouts.
"""

import asyncio

from redis import exceptions as redis_errors

from ._core import (Decision, Engine, MultiDecision, Refund, check_cost, is_noscript,
                    is_unavailable, is_unknown_command, monotonic)


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


class Limiter:
    """The asyncio `redis_rl.Limiter`: the same options and methods, awaited. `timeout_ms` is
    enforced with asyncio.wait_for on every call, on any client.

    - `on_error` (required): what to decide when Redis cannot (connection errors, timeouts,
      OOM, READONLY and LOADING replies): "open" allows, "closed" denies, "local" decides in
      process with an exact bucket of rate / instances and capacity / instances per key.
    - `instances`: how many processes share the limit (for "local"); default 1.
    - `deny_cache`: the hot-key shield. After Redis denies (key, cost) with retry_after_ms = R,
      answer that key as denied locally for R, for any cost at least as large. True (10,000
      entries), False, or the number of entries to keep.
    - `without_module` (default "lua"): on a server without the module, run the shipped Lua
      script ("lua") or raise ModuleMissingError ("refuse").
    - `timeout_ms` (default 50): each call's deadline (asyncio.wait_for).
    - `probe_interval_ms` (default 100): during an outage, Redis is tried again at most this
      often; the calls in between are decided by the policy at once.
    - `local_max_keys` (default 100,000): the most buckets "local" keeps (least recently used
      out).

    `counters` counts decisions by source, and outages.
    """

    def __init__(self, client, *, on_error, instances=1, deny_cache=False, without_module="lua",
                 timeout_ms=50, probe_interval_ms=100, local_max_keys=100_000, clock=monotonic):
        self._engine = Engine(on_error, instances, deny_cache, without_module, timeout_ms,
                              probe_interval_ms, local_max_keys, clock)
        self.client = client

    async def _deadline(self, call):
        return await asyncio.wait_for(call, self._engine.timeout_s)

    @property
    def counters(self):
        """Decisions by source ("redis", "lua", "cache", "local", "open", "closed") and the
        number of outages seen, as a new dict."""
        with self._engine.lock:
            return dict(self._engine.counters)

    @property
    def path(self):
        """How Redis is reached: "module", "lua", "missing", or None before the first call."""
        return self._engine.mode

    def table(self, name, shards=1):
        """A bucket table of this limiter: `shards` tables `name:{0}` … (redis_rl.table)."""
        from .table import AsyncTable

        return AsyncTable(self, name, shards)

    async def acquire(self, key, limit, cost=1):
        """Takes `cost` tokens from the bucket `key` of `limit`; returns a Decision."""
        cost = check_cost(cost)
        engine = self._engine
        hit = engine.cached(key, limit, cost)
        if hit is not None:
            return hit
        items = [(key, limit, cost)]
        if engine.skip_redis():
            return engine.policy_acquire(key, limit, cost)
        sent_at = engine.clock()
        try:
            reply = await self._deadline(self._call("acquire", items))
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, asyncio.TimeoutError) as error:
            if not is_unavailable(error):
                raise
            engine.failed(error)
            return engine.policy_acquire(key, limit, cost)
        source = engine.source()
        engine.answered(source)
        decision = Decision(*reply, limit, source)
        engine.remember(key, limit, cost, decision, sent_at)
        return decision

    async def peek(self, key, limit, cost=1):
        """What `acquire` would decide for `cost`, taking nothing."""
        cost = check_cost(cost)
        engine = self._engine
        if engine.skip_redis():
            return engine.policy_acquire(key, limit, cost, take=False)
        try:
            reply = await self._deadline(self._call("peek", [(key, limit, cost)]))
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, asyncio.TimeoutError) as error:
            if not is_unavailable(error):
                raise
            engine.failed(error)
            return engine.policy_acquire(key, limit, cost, take=False)
        source = engine.source()
        engine.answered(source)
        return Decision(*reply, limit, source)

    async def acquire_all(self, items):
        """All or nothing over [(key, limit)] or [(key, limit, cost)]: takes every bucket's
        cost if each holds it, else nothing. In a cluster every key must hash to one slot:
        give them one hash tag, as in "{user:42}:s" and "{user:42}:h"."""
        items = [(key, limit, check_cost(rest[0] if rest else 1)) for key, limit, *rest in items]
        if not items:
            raise ValueError("acquire_all needs at least one (key, limit)")
        engine = self._engine
        for index, (key, limit, cost) in enumerate(items):
            hit = engine.cached(key, limit, cost)
            if hit is not None:
                return MultiDecision(False, index, hit.retry_after_ms, (), "cache")
        if engine.skip_redis():
            return engine.policy_acquire_all(items)
        sent_at = engine.clock()
        try:
            allowed, refused, retry, replies = await self._deadline(self._call("multi", items))
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, asyncio.TimeoutError) as error:
            if not is_unavailable(error):
                raise
            engine.failed(error)
            return engine.policy_acquire_all(items)
        source = engine.source()
        engine.answered(source)
        decisions = [Decision(*r, limit, source) for r, (_, limit, _) in zip(replies, items)]
        if not allowed:
            # Only refusing buckets are remembered, each with its own wait.
            for (key, limit, cost), d in zip(items, decisions):
                engine.remember(key, limit, cost, d, sent_at)
        return MultiDecision(allowed, refused, retry, decisions, source)

    async def refund(self, key, limit, cost=1):
        """Gives `cost` tokens back (a request that failed before doing any work) and clears
        the deny cache's entry for `key`."""
        cost = check_cost(cost)
        engine = self._engine
        engine.forget(key)
        if engine.skip_redis():
            return engine.policy_refund(key, limit, cost)
        try:
            remaining, reset_after_ms = await self._deadline(self._call("refund", [(key, limit, cost)]))
        except (redis_errors.RedisError, redis_errors.RedisClusterException, OSError, asyncio.TimeoutError) as error:
            if not is_unavailable(error):
                raise
            engine.failed(error)
            return engine.policy_refund(key, limit, cost)
        source = engine.source()
        engine.answered(source)
        return Refund(remaining, reset_after_ms, source)

    # The call into Redis --------------------------------------------------------------------

    async def _detect(self):
        # A cluster client needs a node for a command without keys: any one will do.
        options = {}
        if hasattr(self.client, "get_random_node"):
            await self.client.initialize()  # an asyncio cluster client learns its nodes here
            options = {"target_nodes": self.client.get_random_node()}
        reply = await self.client.execute_command("COMMAND INFO", "RL.ACQUIRE", **options)
        self._engine.detected(reply)

    async def _call(self, op, items):
        engine = self._engine
        if engine.mode is None:
            await self._detect()
        engine.refuse_if_missing()
        try:
            return await self._send(op, items)
        except redis_errors.ResponseError as error:
            if not is_unknown_command(error):
                raise
            # The module went away (or came): look again, then retry once on the new path.
            await self._detect()
            engine.refuse_if_missing()
            return await self._send(op, items)

    async def _send(self, op, items):
        engine = self._engine
        args = engine.command(op, items)
        if engine.mode == "module":
            if op == "multi" and hasattr(self.client, "get_node_from_key"):
                # redis-py's cluster client refuses a command name with two dots
                # (RL.ACQUIRE.MULTI), so send it to the node that owns the first key's slot.
                node = self.client.get_node_from_key(items[0][0])
                return await node.execute_command(*args)
            return await self.client.execute_command(*args)
        if engine.sha is None:
            engine.sha = await self.client.script_load(engine.script)
        try:
            return await self.client.execute_command("EVALSHA", engine.sha, *args)
        except redis_errors.ResponseError as error:
            if not is_noscript(error):
                raise
            engine.sha = await self.client.script_load(engine.script)
            return await self.client.execute_command("EVALSHA", engine.sha, *args)
