// Bucket tables (src/table.js) against real servers, through ioredis and node-redis: the
// shared vectors (shard hash and table sequences) on the module's tables and on the Lua
// fallback, the keys each path writes, the failure policy during an outage, and the deny cache
// counted by INFO commandstats.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import Redis from "ioredis";
import { createClient } from "redis";
import {
  Limit, Limiter, MAX_BUCKETS_PER_TABLE, ModuleMissingError, ReservationNotOpenError, Table, shardOf, shardsFor,
} from "../src/index.js";
import { adapt } from "../src/adapter.js";
import { Server, calls } from "./servers.js";

const vectors = JSON.parse(readFileSync(new URL("../../vectors/table.json", import.meta.url), "utf8"));
const SLOW = new Limit(0.001, 2); // no refill can matter while a test runs
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test("fields map to the shards and keys of the vectors", () => {
  assert.equal(vectors.format, 1);
  assert.ok(vectors.shards.length > 100);
  for (const c of vectors.shards) {
    const what = JSON.stringify(c);
    assert.equal(shardOf(c.field, c.shards), c.shard, what);
    const b = new Table(null, "api", c.shards).bucket(c.field);
    assert.deepEqual([b.table, b.key, b.field], [c.table_key, c.fallback_key, c.field], what);
  }
});

test("bad tables are refused where they are written", () => {
  for (const [name, shards, error] of [["a{b}", 1, /name must not contain/], ["a}", 1, /name must not contain/],
    ["", 1, /name must be/], ["t", 0, /shards must be/], ["t", 16385, /shards must be/], ["t", 1.5, /shards must be/]]) {
    assert.throws(() => new Table(null, name, shards), error, `${name} ${shards}`);
  }
  assert.throws(() => new Table(null, "t").bucket(Buffer.from("x")), /field must be a string/);
});

test("expectedBuckets picks enough shards for MAX_BUCKETS_PER_TABLE buckets each", () => {
  const per = MAX_BUCKETS_PER_TABLE;
  for (const [expected, shards] of [[0, 1], [1, 1], [per - 1, 1], [per, 1], [per + 1, 2], [3 * per, 3],
    [3 * per + 1, 4], [10_000 * per, 10_000], [16384 * per, 16384]]) {
    assert.equal(shardsFor(expected), shards, String(expected));
    const table = new Table(null, "t", { expectedBuckets: expected });
    assert.equal(table.shards, shards, String(expected));
    assert.ok(Math.ceil(expected / table.shards) <= per, String(expected));
  }
  for (const [bad, error] of [[-1, /expectedBuckets must be/], [1.5, /expectedBuckets must be/], ["10", /expectedBuckets must be/],
    [16384 * per + 1, /more than the 16384/]]) {
    assert.throws(() => new Table(null, "t", { expectedBuckets: bad }), error, String(bad));
  }
  assert.equal(new Table(null, "t").shards, 1);
  assert.equal(new Table(null, "t", 7).shards, 7);
  assert.equal(new Table(null, "t", { shards: 7 }).shards, 7);
  assert.throws(() => new Table(null, "t", "4"), /shards must be/);
});

test("too few shards for the expected buckets warn and are kept; enough say nothing", () => {
  const logs = [];
  const limiter = { logger: { warn: (m) => logs.push(m) } };
  const expected = 3 * MAX_BUCKETS_PER_TABLE + 1;
  assert.equal(new Table(limiter, "big", { shards: 2, expectedBuckets: expected }).shards, 2);
  assert.equal(logs.length, 1);
  assert.match(logs[0], new RegExp(`"big": 2 shards for ${expected} expected buckets`));
  assert.match(logs[0], /4 shards would keep each under it/);
  assert.equal(new Table(limiter, "t", { shards: 4, expectedBuckets: 4 * MAX_BUCKETS_PER_TABLE }).shards, 4);
  assert.equal(new Table(limiter, "t", { shards: 9, expectedBuckets: 1 }).shards, 9);
  assert.equal(logs.length, 1);
});

const CLIENTS = {
  async ioredis(port) {
    const c = new Redis({ port, host: "127.0.0.1", retryStrategy: () => 50, enableOfflineQueue: false, lazyConnect: true });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  },
  async "node-redis"(port) {
    const c = createClient({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 }, disableOfflineQueue: true });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: () => c.destroy() };
  },
};

async function withSetup(body) {
  const cleanups = [];
  const ctx = {
    async server(module = true) {
      const s = await Server.start(module);
      cleanups.push(() => s.close());
      return s;
    },
    async admin(server) {
      const c = await CLIENTS.ioredis(server.port);
      cleanups.push(c.close);
      return adapt(c.client);
    },
    async limiter(kind, server, options = {}) {
      const { client, close } = await CLIENTS[kind](server.port);
      cleanups.push(close);
      const logs = [];
      const limiter = new Limiter(client, { onError: "closed", timeoutMs: 500, logger: { warn: (m) => logs.push(m) }, ...options });
      limiter.logs = logs;
      return limiter;
    },
  };
  try {
    await body(ctx);
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}

/** Runs one vector sequence on `table`: allowed, remaining, -1, delete and len exactly; the
 * waits within the time the sequence has taken. */
async function runSequence(table, seq) {
  const limit = new Limit(Number(seq.rate), Number(seq.capacity));
  const started = performance.now();
  for (const [i, step] of seq.steps.entries()) {
    const what = `${seq.name} step ${i} ${JSON.stringify(step)}`;
    if (step.op === "delete") {
      assert.equal(await table.delete(...step.fields), step.expect, what);
    } else if (step.op === "len") {
      assert.equal(await table.len(), step.expect, what);
    } else {
      const got = await table[step.op](step.field, limit, Number(step.cost));
      const tookMs = Math.ceil(performance.now() - started) + 1;
      if (step.op === "refund") {
        assert.equal(got.remaining, step.expect[0], what);
        assert.ok(Math.abs(got.resetAfterMs - step.expect[1]) <= tookMs, what);
        continue;
      }
      const [allowed, remaining, retry, reset] = step.expect;
      assert.deepEqual([got.allowed, got.remaining], [Boolean(allowed), remaining], what);
      assert.equal(got.retryAfterMs < 0, retry < 0, what);
      assert.ok(Math.abs(got.retryAfterMs - retry) <= tookMs, what);
      assert.ok(Math.abs(got.resetAfterMs - reset) <= tookMs, what);
    }
  }
}

for (const kind of Object.keys(CLIENTS)) {
  test(`${kind}: expectedBuckets spreads the fields over that many keys`, () => withSetup(async (t) => {
    const s = await t.server(true);
    const table = (await t.limiter(kind, s)).table("sized", { expectedBuckets: 3 * MAX_BUCKETS_PER_TABLE });
    assert.equal(table.shards, 3);
    for (let n = 0; n < 60; n++) assert.equal((await table.acquire(`user:${n}`, SLOW)).allowed, true);
    const admin = await t.admin(s);
    const keys = (await admin.send(["KEYS", "*"])).map(String).sort();
    assert.deepEqual(keys, ["sized:{0}", "sized:{1}", "sized:{2}"]);
    let total = 0;
    for (const key of keys) total += Number(await admin.send(["RL.HLEN", key]));
    assert.equal(total, 60);
  }));

  for (const module of [true, false]) {
    test(`${kind}: ${module ? "module tables" : "the Lua fallback"} give the vectors' replies`, () => withSetup(async (t) => {
      const limiter = await t.limiter(kind, await t.server(module));
      for (const seq of vectors.sequences) await runSequence(limiter.table(seq.table, seq.shards), seq);
      assert.equal(limiter.path, module ? "module" : "lua");
      assert.equal(limiter.counters[module ? "lua" : "redis"], 0);
    }));
  }

  for (const module of [true, false]) {
    // RL.HRESERVE / RL.HSETTLE on the table key and field with the module; the reserve and
    // settle of the field's own key on the fallback.
    test(`${kind}: a reservation on a table field, ${module ? "the module" : "the Lua fallback"}`, () => withSetup(async (t) => {
      const s = await t.server(module);
      const admin = await t.admin(s);
      const table = (await t.limiter(kind, s)).table("res", 4);
      const limit = new Limit(0.001, 10);
      const source = module ? "redis" : "lua";
      const r = await table.reserve("alice", limit, 4, 60_000);
      assert.deepEqual([r.allowed, r.remaining, r.source, r.id.length], [true, 6, source, 16]);
      assert.equal((await table.peek("alice", limit, 0)).remaining, 6);
      assert.equal((await table.peek("bob", limit, 0)).remaining, 10);
      const own = `res:{${shardOf("alice", 4)}}`;
      assert.deepEqual((await admin.send(["KEYS", "*"])).map(String), [module ? own : `${own}:alice`]);
      if (!module) assert.ok((await admin.send(["HKEYS", `${own}:alice`])).map(String).includes(`r:${r.id}`));
      const again = await table.reserve("alice", limit, 4, 60_000, r.id); // a retry takes nothing
      assert.deepEqual([again.allowed, again.remaining], [true, 6]);
      const c = await r.settle(1);
      assert.deepEqual([c.applied, c.remaining, c.source], [true, 9, source]);
      assert.equal(await r.settle(1), c);
      await assert.rejects(table.settle("alice", limit, r.id, 1), ReservationNotOpenError);
      const denied = await table.reserve("alice", limit, 10, 60_000);
      assert.deepEqual([denied.allowed, denied.id], [false, ""]);
      await table.reserve("alice", limit, 2, 60_000, "job-1");
      assert.equal((await table.settle("alice", limit, "job-1", 12)).remaining, -3);
    }));
  }

  test(`${kind}: the module keeps one key per shard, the Lua path one hash per field under its tag`, () => withSetup(async (t) => {
    for (const module of [true, false]) {
      const s = await t.server(module);
      const table = (await t.limiter(kind, s)).table("api", 4);
      const fields = ["a", "b", "c", "d", "e", "f", "g", "h"];
      for (const f of fields) assert.equal((await table.acquire(f, SLOW)).source, module ? "redis" : "lua");
      const admin = await t.admin(s);
      const keys = (await admin.send(["KEYS", "*"])).map(String).sort();
      const expected = module
        ? [...new Set(fields.map((f) => `api:{${shardOf(f, 4)}}`))].sort()
        : fields.map((f) => `api:{${shardOf(f, 4)}}:${f}`).sort();
      assert.deepEqual(keys, expected, `module=${module}`);
      for (const key of keys) {
        const type = String(await admin.send(["TYPE", key]));
        if (module) assert.ok(!["hash", "string", "none"].includes(type), type);
        else assert.equal(type, "string");
      }
      assert.equal(await table.len(), fields.length);
      // A name with glob characters counts only its own keys, and keys SCAN's pattern also
      // matches but no shard below 4 owns do not count.
      const other = (await t.limiter(kind, s)).table("a*", 4);
      await other.acquire("x", SLOW);
      for (const stray of ["api:{x}:f", "api:{07}:f", "api:{4}:f", "api:{}:f"]) await admin.send(["SET", stray, "1"]);
      assert.deepEqual([await table.len(), await other.len()], [fields.length, 1]);
    }
  }));

  test(`${kind}: WRONGTYPE is raised, not decided by the policy; "refuse" is a misconfiguration`, () => withSetup(async (t) => {
    const s = await t.server(true);
    const table = (await t.limiter(kind, s, { onError: "open" })).table("t");
    await (await t.admin(s)).send(["SET", "t:{0}", "x"]);
    await assert.rejects(table.acquire("f", SLOW), /WRONGTYPE/);
    const limiter = await t.limiter(kind, await t.server(false), { withoutModule: "refuse", logger: { warn() {}, error() {} } });
    const refusing = limiter.table("t");
    // A decision follows the policy (closed here), counted as a misconfiguration; delete and
    // len, which are not decisions, reject.
    assert.equal((await refusing.acquire("f", SLOW)).source, "closed");
    assert.deepEqual([limiter.counters.misconfigured, limiter.counters.outages], [1, 0]);
    await assert.rejects(refusing.len(), ModuleMissingError);
  }));

  for (const [onError, module] of [["open", true], ["closed", true], ["local", true], ["local", false]]) {
    test(`${kind}: outage with onError ${onError} (${module ? "module" : "lua"}), then back`, () => withSetup(async (t) => {
      const s = await t.server(module);
      const limiter = await t.limiter(kind, s, { onError, instances: 2, probeIntervalMs: 0 });
      const table = limiter.table("t", 3);
      const source = module ? "redis" : "lua";
      assert.equal((await table.acquire("warm", SLOW)).source, source);
      await s.stop();
      const limit = new Limit(0.001, 4);
      const down = [];
      for (let i = 0; i < 6; i++) down.push(await table.acquire("f", limit));
      // Not decisions: they reject rather than pretend.
      await assert.rejects(table.delete("f"));
      await assert.rejects(table.len());
      assert.equal(limiter.logs.length, 1, limiter.logs.join("\n"));
      assert.deepEqual(new Set(down.map((d) => d.source)), new Set([onError]));
      const allowed = down.map((d) => d.allowed);
      if (onError === "open") assert.deepEqual(allowed, [true, true, true, true, true, true]);
      if (onError === "closed") assert.deepEqual(allowed, [false, false, false, false, false, false]);
      if (onError === "local") {
        assert.deepEqual(allowed, [true, true, false, false, false, false]);
        // Local buckets are per table and field.
        assert.equal((await table.acquire("g", limit)).allowed, true);
        assert.equal((await limiter.table("u", 3).acquire("f", limit)).allowed, true);
      }
      await s.start();
      const end = Date.now() + 15_000;
      let back;
      while ((back = await table.acquire("f", limit)).source !== source) {
        assert.ok(Date.now() < end, "decisions did not return to Redis");
        await sleep(50);
      }
      assert.equal(back.remaining, 3); // the restarted server is empty
    }));
  }

  test(`${kind}: the deny cache keeps a denied field off the server, keyed by table and field`, () => withSetup(async (t) => {
    for (const module of [true, false]) {
      const s = await t.server(module);
      const limiter = await t.limiter(kind, s, { denyCache: true });
      const table = limiter.table("hot", 4);
      const limit = new Limit(0.001, 1);
      assert.equal((await table.acquire("f", limit)).allowed, true);
      for (let i = 0; i < 200; i++) assert.equal((await table.acquire("f", limit)).allowed, false);
      const admin = await t.admin(s);
      // On the Lua path the first EVALSHA answered NOSCRIPT, then went as EVAL: one more call.
      const sent = async () => (module ? calls(admin, "rl.hacquire")
        : (await calls(admin, "evalsha")) + (await calls(admin, "eval")));
      assert.equal(await sent(), module ? 2 : 3, `module=${module}`);
      assert.equal(limiter.counters.cache, 199);
      assert.equal((await table.acquire("g", limit)).allowed, true);
      assert.equal((await limiter.table("cold", 4).acquire("f", limit)).allowed, true);
      assert.equal(await sent(), module ? 4 : 5);
      // delete resets the bucket and clears the entry: the next call asks, and is allowed.
      assert.equal(await table.delete("f"), 1);
      const again = await table.acquire("f", limit);
      assert.deepEqual([again.allowed, again.source], [true, module ? "redis" : "lua"]);
      // refund clears it too.
      await table.acquire("f", limit);
      assert.equal((await table.acquire("f", limit)).source, "cache");
      assert.equal((await table.refund("f", limit)).remaining, 1);
      assert.equal((await table.acquire("f", limit)).source, module ? "redis" : "lua");
    }
  }));
}
