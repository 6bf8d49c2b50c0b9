// The limiter on a real Redis Cluster through ioredis's Cluster and node-redis's
// createCluster: each key's commands (module and Lua script) reach its shard, acquireAll works
// over one hash tag and fails without one. Needs RL_CLUSTER=host:port of a cluster with the
// module (make test-clients-cluster starts one with scripts/cluster.sh); skipped otherwise.
// Leases and reservations too, on both paths.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import Redis from "ioredis";
import { createCluster } from "redis";
import { Limit, Limiter } from "../src/index.js";

const CLUSTER = process.env.RL_CLUSTER;
const SLOW = new Limit(0.001, 3);
const skip = !CLUSTER && "set RL_CLUSTER=host:port (make test-clients-cluster)";

const CLIENTS = {
  async ioredis(host, port) {
    const c = new Redis.Cluster([{ host, port }], { enableOfflineQueue: true });
    await new Promise((resolve, reject) => { c.once("ready", resolve); c.once("error", reject); });
    return { client: c, close: () => c.disconnect() };
  },
  async "node-redis"(host, port) {
    const c = createCluster({ rootNodes: [{ url: `redis://${host}:${port}` }] });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: () => c.destroy() };
  },
};

for (const kind of Object.keys(CLIENTS)) {
  test(`${kind} cluster: module and Lua paths reach each key's shard`, { skip }, async () => {
    const [host, port] = CLUSTER.split(":");
    const { client, close } = await CLIENTS[kind](host, Number(port));
    try {
      for (const path of ["module", "lua"]) {
        const limiter = new Limiter(client, { onError: "closed", timeoutMs: 2000 });
        // The cluster has the module: take the script path as a server without it would.
        if (path === "lua") limiter.path = "lua";
        const source = path === "module" ? "redis" : "lua";
        for (let i = 0; i < 12; i++) { // keys spread over every shard
          const key = `${path}:${randomUUID()}`;
          const got = [];
          for (let j = 0; j < 4; j++) got.push(await limiter.acquire(key, SLOW));
          assert.deepEqual(got.map((d) => [d.allowed, d.remaining, d.source]),
            [[true, 2, source], [true, 1, source], [true, 0, source], [false, 0, source]], `${path} ${key}`);
          assert.equal((await limiter.refund(key, SLOW)).remaining, 1);
        }
        const tag = `{${randomUUID()}}`;
        const items = [[`${tag}:s`, new Limit(0.001, 2)], [`${tag}:h`, new Limit(0.001, 1)]];
        assert.equal((await limiter.acquireAll(items)).allowed, true);
        const refused = await limiter.acquireAll(items);
        assert.deepEqual([refused.allowed, refused.refusedIndex, refused.source], [false, 1, source]);
        await assert.rejects(limiter.acquireAll([["a" + randomUUID(), SLOW], ["b" + randomUUID(), SLOW], ["c" + randomUUID(), SLOW]]));
        for (let i = 0; i < 12; i++) { // a charge into debt reaches each key's shard too
          const key = `charge:${path}:${randomUUID()}`;
          const c = await limiter.charge(key, SLOW, 5);
          assert.deepEqual([c.applied, c.remaining, c.source], [true, -2, source], `${path} ${key}`);
          assert.equal((await limiter.acquire(key, SLOW, 0)).allowed, false);
          assert.equal((await limiter.peek(key, SLOW, 0)).remaining, -2);
        }
        for (let i = 0; i < 12; i++) { // leases and reservations reach each key's shard
          const key = `lease:${path}:${randomUUID()}`;
          const boom = new Error("failed");
          await assert.rejects(limiter.withLease(key, 1, 10_000, async (lease) => {
            assert.equal(lease.source, source);
            assert.equal((await limiter.lease(key, 1, 10_000)).allowed, false);
            throw boom;
          }), (e) => e === boom);
          assert.equal((await limiter.leases(key, 1)).inUse, 0, `${path} ${key}`);
          const r = await limiter.reserve(`resv:${path}:${randomUUID()}`, SLOW, 2, 10_000);
          assert.deepEqual([r.allowed, r.remaining, (await r.settle(1)).remaining], [true, 1, 2], `${path} ${r.key}`);
        }
        const t = await limiter.table(`usage${randomUUID()}`, 3).charge("alice", SLOW, 4);
        assert.deepEqual([t.applied, t.remaining, t.source], [true, -1, source]);
      }
    } finally {
      await close();
    }
  });
}
