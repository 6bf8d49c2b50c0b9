// Tests for api.js and worker-pool.js (thin apps on the redis-rl library) against a real
// server with the module: `npm test`. REDIS_URL names the server (examples/run.sh starts one).
// Nothing here starts Redis. Keys are unique per run.

import assert from "node:assert/strict";
import net from "node:net";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { Limit } from "redis-rl";
import { makeApi, makeClient } from "./api.js";
import { run } from "./worker-pool.js";

const url = process.env.REDIS_URL;
assert.ok(url, "set REDIS_URL to a server with the module (examples/run.sh does)");
const redis = makeClient(url);
before(() => new Promise((resolve) => redis.once("ready", resolve)));
after(() => redis.disconnect());

/** Serves `server` on a free port; resolves to a GET function and a close. */
async function serve(server) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  return { get: (path = "/") => fetch(base + path), close: () => new Promise((r) => server.close(r)) };
}

test("the API: burst, then a problem+json 429 with the rate limit fields", async () => {
  const app = await serve(makeApi(redis, { limit: new Limit(0.001, 3), prefix: `node-example:${randomUUID()}:` }));
  try {
    for (const [remaining, reset] of [[2, 1000], [1, 2000], [0, 3000]]) {
      const r = await app.get();
      assert.deepEqual([r.status, await r.json()], [200, { hello: "world" }]);
      assert.equal(r.headers.get("ratelimit-policy"), '"default";q=3;w=3000');
      assert.equal(r.headers.get("ratelimit"), `"default";r=${remaining};t=${reset}`);
      assert.equal(r.headers.get("x-ratelimit-remaining"), String(remaining));
    }
    const refused = await app.get();
    assert.deepEqual([refused.status, refused.headers.get("retry-after")], [429, "1000"]);
    assert.equal(refused.headers.get("content-type"), "application/problem+json");
    assert.equal((await refused.json()).status, 429);
    for (let i = 0; i < 3; i++) assert.equal((await app.get("/health")).status, 200);
  } finally {
    await app.close();
  }
});

test("the API fails open without Redis", async () => {
  const probe = net.createServer();
  await new Promise((r) => probe.listen(0, "127.0.0.1", r));
  const { port } = probe.address();
  await new Promise((r) => probe.close(r));
  const dead = makeClient(`redis://127.0.0.1:${port}`);
  const app = await serve(makeApi(dead, { logger: { warn() {} } }));
  try {
    for (let i = 0; i < 7; i++) {
      const r = await app.get();
      assert.deepEqual([r.status, r.headers.get("ratelimit")], [200, null]);
    }
  } finally {
    await app.close();
    dead.disconnect();
  }
});

test("the worker pool takes turns at the vendor's rate", async () => {
  const start = performance.now();
  const jobs = Array.from({ length: 12 }, (_, i) => i);
  const results = await run(redis, jobs, { workers: 6, limit: new Limit(20, 1), key: `node-example:${randomUUID()}` });
  assert.deepEqual(results, jobs.map((j) => j * j));
  // 12 calls at 20/s with no burst: the 12th is 11 intervals (550 ms) after the first.
  assert.ok(performance.now() - start >= 549);
});
