"""Both limiters on a real Redis Cluster (redis-py RedisCluster and redis.asyncio.RedisCluster):
module commands, the Functions library and the Lua script routed to the key's shard,
acquire_all over one hash tag, CROSSSLOT without one, acquire_across_slots over every shard.
Needs RL_CLUSTER=host:port of a cluster with the module (make test-clients-cluster starts one
with scripts/cluster.sh, as make cluster does); skipped otherwise."""

import os
import unittest
import uuid

import redis
import redis.asyncio

import redis_rl
from redis_rl import Limit, Limiter
from redis_rl.asyncio import Limiter as AsyncLimiter

CLUSTER = os.environ.get("RL_CLUSTER")
SLOW = Limit(0.001, 3)


def node():
    host, port = CLUSTER.rsplit(":", 1)
    return host, int(port)


@unittest.skipUnless(CLUSTER, "set RL_CLUSTER=host:port (make test-clients-cluster)")
class Cluster(unittest.TestCase):
    def setUp(self):
        host, port = node()
        self.client = redis.RedisCluster(host=host, port=port, socket_timeout=2)
        self.addCleanup(self.client.close)
        self.tag = uuid.uuid4().hex

    def keys_on_every_shard(self):
        # Keys whose slots fall in different thirds of the slot range: one per master here.
        keys, seen = [], set()
        for i in range(1000):
            key = f"{self.tag}:{i}"
            third = self.client.keyslot(key) * 3 // 16384
            if third not in seen:
                seen.add(third)
                keys.append(key)
        return keys

    def test_module_and_lua_paths_route_each_key_to_its_shard(self):
        for path in ("module", "lua"):
            limiter = Limiter(self.client, on_error="closed", timeout_ms=1000)
            if path == "lua":
                # The cluster has the module: take the script path as a server without it would.
                limiter._engine.mode = "lua"
            source = "redis" if path == "module" else "lua"
            for key in self.keys_on_every_shard():
                key = f"{path}:{key}"
                got = [limiter.acquire(key, SLOW) for _ in range(4)]
                self.assertEqual([(d.allowed, d.remaining, d.source) for d in got],
                                 [(True, 2, source), (True, 1, source), (True, 0, source), (False, 0, source)],
                                 f"{path} {key}")
                self.assertEqual(limiter.refund(key, SLOW).remaining, 1)

    def test_charges_reach_each_keys_shard_on_module_and_lua_paths(self):
        for path in ("module", "lua"):
            limiter = Limiter(self.client, on_error="closed", timeout_ms=1000)
            if path == "lua":
                limiter._engine.mode = "lua"
            source = "redis" if path == "module" else "lua"
            for key in self.keys_on_every_shard():
                key = f"charge:{path}:{key}"
                c = limiter.charge(key, SLOW, 5)
                self.assertEqual((c.applied, c.remaining, c.source), (True, -2, source), f"{path} {key}")
                self.assertFalse(limiter.acquire(key, SLOW, 0).allowed)
                self.assertEqual(limiter.peek(key, SLOW, 0).remaining, -2)
            c = limiter.table(f"usage{self.tag}{path}", shards=3).charge("alice", SLOW, 4)
            self.assertEqual((c.applied, c.remaining, c.source), (True, -1, source))

    def test_acquire_all_needs_one_hash_tag(self):
        for path in ("module", "lua"):
            limiter = Limiter(self.client, on_error="closed", timeout_ms=1000)
            if path == "lua":
                limiter._engine.mode = "lua"
            tag = "{" + self.tag + path + "}"
            items = [(tag + ":s", Limit(0.001, 2)), (tag + ":h", Limit(0.001, 1))]
            self.assertTrue(limiter.acquire_all(items).allowed)
            refused = limiter.acquire_all(items)
            self.assertEqual((refused.allowed, refused.refused_index, refused.source),
                             (False, 1, "redis" if path == "module" else "lua"))
            a, b = self.keys_on_every_shard()[:2]
            # CROSSSLOT from the server, on every path (docs/clients.md).
            with self.assertRaises(redis.exceptions.ClusterCrossSlotError, msg=path):
                limiter.acquire_all([(a, SLOW), (b, SLOW)])

    def test_functions_library_on_every_master_and_across_slots(self):
        self.assertEqual(redis_rl.load_functions(self.client), redis_rl.FUNCTIONS_VERSION)
        limiter = Limiter(self.client, on_error="closed", timeout_ms=1000)
        limiter._engine.mode = "functions"  # the cluster has the module: take the library's path
        for key in self.keys_on_every_shard():
            key = f"fn:{key}"
            got = [limiter.acquire(key, SLOW) for _ in range(4)]
            self.assertEqual([(d.allowed, d.remaining, d.source) for d in got],
                             [(True, 2, "functions"), (True, 1, "functions"), (True, 0, "functions"),
                              (False, 0, "functions")], key)
            self.assertEqual(limiter.peek(key, SLOW, 0).remaining, 0)
        for path in ("module", "functions", "lua"):
            limiter = Limiter(self.client, on_error="closed", timeout_ms=1000)
            limiter._engine.mode = path
            keys = [f"across:{path}:{k}" for k in self.keys_on_every_shard()]
            taken = limiter.acquire_across_slots([(k, SLOW, 2) for k in keys])
            self.assertEqual((taken.allowed, {o.kind for o in taken.outcomes}), (True, {"taken"}), path)
            # The last key holds 1 token: 2 more refuses, and the others are given back.
            refused = limiter.acquire_across_slots([(k, SLOW, 1) for k in keys[:-1]] + [(keys[-1], SLOW, 2)])
            self.assertEqual([o.kind for o in refused.outcomes],
                             ["not_taken"] * (len(keys) - 1) + ["refused"], path)
            self.assertEqual([limiter.peek(k, SLOW, 0).remaining for k in keys], [1] * len(keys), path)

    def test_asyncio_cluster(self):
        import asyncio

        async def run():
            host, port = node()
            client = redis.asyncio.RedisCluster(host=host, port=port)
            try:
                limiter = AsyncLimiter(client, on_error="closed", timeout_ms=1000)
                out = []
                for key in self.keys_on_every_shard():
                    out.append([(await limiter.acquire("a:" + key, SLOW)).remaining for _ in range(4)])
                return out
            finally:
                await client.aclose()

        for remaining in asyncio.run(run()):
            self.assertEqual(remaining, [2, 1, 0, 0])


if __name__ == "__main__":
    unittest.main()
