// Bucket tables on a real Redis Cluster through ioredis's Cluster and node-redis's
// createCluster: a 16-shard table's decisions, len and delete across the masters, on the
// module's tables and on the Lua path (fallback keys, counted by SCAN on the masters). Needs
// RL_CLUSTER=host:port of a cluster with the module (make test-clients-cluster starts one);
// skipped otherwise.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import Redis from "ioredis";
import { createCluster } from "redis";
import { Limit, Limiter } from "../src/index.js";

const CLUSTER = process.env.RL_CLUSTER;
const SLOW = new Limit(0.001, 2);
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
  test(`${kind} cluster: a table's fields spread over the shards on both paths`, { skip }, async () => {
    const [host, port] = CLUSTER.split(":");
    const { client, close } = await CLIENTS[kind](host, Number(port));
    try {
      const fields = Array.from({ length: 48 }, (_, n) => `203.0.113.${n}`);
      for (const path of ["module", "lua"]) {
        const limiter = new Limiter(client, { onError: "closed", timeoutMs: 2000 });
        if (path === "lua") limiter.path = "lua"; // the script on the module's cluster
        const table = limiter.table(`ip${randomUUID().slice(0, 8)}`, 16);
        const source = path === "module" ? "redis" : "lua";
        for (const field of fields) {
          const got = [];
          for (let j = 0; j < 3; j++) got.push(await table.acquire(field, SLOW));
          assert.deepEqual(got.map((d) => [d.allowed, d.source]), [[true, source], [true, source], [false, source]], `${path} ${field}`);
        }
        assert.equal(await table.len(), fields.length, path);
        assert.equal(await table.delete(...fields.slice(0, 10)), 10, path);
        assert.equal(await table.len(), fields.length - 10, path);
        assert.equal((await table.acquire(fields[0], SLOW)).allowed, true);
      }
    } finally {
      await close();
    }
  });
}
