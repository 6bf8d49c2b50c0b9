"""Bucket tables on a real Redis Cluster (redis-py RedisCluster and redis.asyncio.RedisCluster):
a 16-shard table's keys on the masters of their slots, decisions, len and delete across them,
on the module's tables and on the Lua path (its fallback keys in their shard's slot). Needs
RL_CLUSTER=host:port of a cluster with the module (make test-clients-cluster starts one);
skipped otherwise."""

import asyncio
import os
import unittest
import uuid

import redis
import redis.asyncio

from redis_rl import Limit, Limiter, shard_of
from redis_rl.asyncio import Limiter as AsyncLimiter

CLUSTER = os.environ.get("RL_CLUSTER")
SLOW = Limit(0.001, 2)


def node():
    host, port = CLUSTER.rsplit(":", 1)
    return host, int(port)


@unittest.skipUnless(CLUSTER, "set RL_CLUSTER=host:port (make test-clients-cluster)")
class TableCluster(unittest.TestCase):
    def setUp(self):
        host, port = node()
        self.client = redis.RedisCluster(host=host, port=port, socket_timeout=2)
        self.addCleanup(self.client.close)
        self.name = "ip" + uuid.uuid4().hex[:8]
        self.fields = [f"203.0.113.{n}" for n in range(48)]

    def test_both_paths_spread_a_table_over_the_masters(self):
        for path in ("module", "lua"):
            limiter = Limiter(self.client, on_error="closed", timeout_ms=2000)
            if path == "lua":
                limiter._engine.mode = "lua"  # the script on the module's cluster
            table = limiter.table(self.name + path, 16)
            source = "redis" if path == "module" else "lua"
            for field in self.fields:
                got = [table.acquire(field, SLOW) for _ in range(3)]
                self.assertEqual([(d.allowed, d.source) for d in got],
                                 [(True, source), (True, source), (False, source)], (path, field))
            self.assertEqual(table.len(), len(self.fields), path)
            masters = set()
            for shard in {shard_of(f, 16) for f in self.fields}:
                key = table.key(shard)
                owner = self.client.get_node_from_key(key)
                masters.add(owner.name)
                held = owner.redis_connection.keys(key + "*")
                self.assertTrue(held, (path, key))
                if path == "lua":  # fallback keys only, each in the table key's slot
                    self.assertTrue(all(k.decode().startswith(key + ":") for k in held))
                    self.assertEqual({self.client.keyslot(k) for k in held}, {self.client.keyslot(key)})
            self.assertEqual(len(masters), 3, f"{path}: 16 shards cover every master")
            self.assertEqual(table.delete(*self.fields[:10]), 10, path)
            self.assertEqual(table.len(), len(self.fields) - 10, path)
            self.assertTrue(table.acquire(self.fields[0], SLOW).allowed)

    def test_asyncio_cluster(self):
        async def run():
            host, port = node()
            client = redis.asyncio.RedisCluster(host=host, port=port)
            try:
                out = []
                for path in ("module", "lua"):
                    limiter = AsyncLimiter(client, on_error="closed", timeout_ms=2000)
                    if path == "lua":
                        limiter._engine.mode = "lua"  # the script on the module's cluster
                    table = limiter.table(self.name + "a" + path, 16)
                    for field in self.fields:
                        await table.acquire(field, SLOW, 2)
                    out.append((await table.len(), await table.delete(*self.fields), await table.len()))
                return out
            finally:
                await client.aclose()

        self.assertEqual(asyncio.run(run()), [(48, 48, 0), (48, 48, 0)])


if __name__ == "__main__":
    unittest.main()
