// RedisRlStore keeps express-rate-limit's store contract, tested with express-rate-limit's own
// options (skipFailedRequests, skipSuccessfulRequests, stacked limiters, limit functions) in
// Express 5 and 4 apps, each run beside express-rate-limit's MemoryStore where the two must
// agree. A bucket of `limit` per 100 s: no refill can matter while a test runs.
import { test } from "node:test";
import assert from "node:assert/strict";
import express5 from "express";
import express4 from "express4";
import { MemoryStore, rateLimit } from "express-rate-limit";
import Redis from "ioredis";
import { Limiter } from "../src/index.js";
import { RedisRlStore, UNWRAPPED_WARNING, withRequest } from "../src/middleware.js";
import { Server, withCleanups } from "./servers.js";

const EXPRESSES = { "express 5": express5, "express 4": express4 };
const WINDOW_MS = 100_000;

/** withCleanups, plus limiters, apps listening on 127.0.0.1:0, and express-rate-limit's log. */
const withSetup = (body) => withCleanups(async (scope) => {
  const ctx = {
    ...scope,
    erlLog: [],
    async limiter(port, options = {}) {
      const c = new Redis({ port, host: "127.0.0.1", retryStrategy: () => 50, enableOfflineQueue: false });
      c.on("error", () => {});
      scope.defer(() => c.disconnect());
      return new Limiter(c, { onError: "closed", logger: { warn() {} }, ...options });
    },
    logger() {
      return { error: (e, m) => ctx.erlLog.push(`${m ?? ""} ${e?.code ?? ""} ${e?.message ?? e}`), warn: (e) => ctx.erlLog.push(String(e?.code ?? e)) };
    },
    async listen(app) {
      const http = await new Promise((r) => { const h = app.listen(0, "127.0.0.1", () => r(h)); });
      scope.defer(() => new Promise((r) => { http.closeAllConnections?.(); http.close(r); }));
      const base = `http://127.0.0.1:${http.address().port}`;
      return (path = "/", headers = {}) => fetch(base + path, { headers });
    },
  };
  await body(ctx);
});

/**
 * An app with one express-rate-limit in front of /ok (200), /fail (500) and /slow (calls
 * `slow.reached()`, then answers when `slow.gate` settles).
 */
function app(express, ctx, erlOptions, slow = {}) {
  const a = express();
  a.use(rateLimit({ windowMs: WINDOW_MS, limit: 3, legacyHeaders: false, standardHeaders: "draft-6", logger: ctx.logger(), ...erlOptions }));
  a.get("/ok", (req, res) => res.send("ok"));
  a.get("/fail", (req, res) => res.status(500).send("boom"));
  a.get("/slow", async (req, res) => { slow.reached(); await slow.gate; res.send("slow"); });
  a.use((err, req, res, next) => res.status(500).send(`error: ${err.message}`)); // eslint-disable-line no-unused-vars
  return a;
}

async function statuses(get, paths) {
  const out = [];
  for (const p of paths) out.push((await get(p)).status);
  return out;
}

const repeat = (path, n) => Array.from({ length: n }, () => path);

for (const [name, express] of Object.entries(EXPRESSES)) {
  // Each case: express-rate-limit options and a sequence of paths; both stores must agree.
  const cases = [
    // skipFailedRequests: a 429 is a failed request and is decremented, but it took nothing.
    ["skipFailedRequests: 20 requests at limit 3 let 3 through", { skipFailedRequests: true }, repeat("/ok", 20), [...repeat(200, 3), ...repeat(429, 17)]],
    // A failed request that did take a token gets it back.
    ["skipFailedRequests: a 500 gives its token back", { skipFailedRequests: true }, [...repeat("/fail", 5), ...repeat("/ok", 4)], [...repeat(500, 5), 200, 200, 200, 429]],
    // skipSuccessfulRequests: successes give their token back, failures and 429s keep nothing.
    ["skipSuccessfulRequests: only failures count", { skipSuccessfulRequests: true }, [...repeat("/ok", 6), ...repeat("/fail", 4), "/ok"], [...repeat(200, 6), 500, 500, 500, 429, 429]],
  ];
  for (const [title, options, paths, expected] of cases) {
    test(`${name}, ${title}, as MemoryStore does`, () => withSetup(async (t) => {
      const limiter = await t.limiter((await t.server()).port);
      const ours = await statuses(await t.listen(app(express, t, { ...options, store: new RedisRlStore({ limiter }) })), paths);
      const memory = await statuses(await t.listen(app(express, t, { ...options, store: new MemoryStore() })), paths);
      assert.deepEqual(memory, expected, "MemoryStore");
      assert.deepEqual(ours, expected, "RedisRlStore");
      assert.deepEqual(t.erlLog, []);
    }));
  }

  test(`${name}: a 429 while an allowed request is in flight does not refund that request's token`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    for (const store of [new RedisRlStore({ limiter }), new MemoryStore()]) {
      let open, reached;
      const inHandler = new Promise((r) => { reached = r; });
      const gate = new Promise((r) => { open = r; });
      const get = await t.listen(app(express, t, { limit: 1, skipFailedRequests: true, store }, { gate, reached }));
      const slow = get("/slow"); // takes the only token, answers when the gate opens
      await inHandler;
      assert.equal((await get("/ok")).status, 429); // decremented: it must give back nothing
      open();
      assert.equal((await slow).status, 200);
      // A decrement runs on "finish", before this client can send again; a refund goes ahead
      // of the next acquire on the one connection.
      assert.equal((await get("/ok")).status, 429, store.constructor.name);
    }
    assert.deepEqual(t.erlLog, []);
  }));

  test(`${name}: stacked limiters with default prefixes keep their own buckets`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    const a = express();
    a.use(rateLimit({ windowMs: WINDOW_MS, limit: 5, standardHeaders: false, legacyHeaders: false, logger: t.logger(), store: new RedisRlStore({ limiter }) }));
    a.use(rateLimit({ windowMs: WINDOW_MS, limit: 2, standardHeaders: "draft-6", legacyHeaders: false, logger: t.logger(), store: new RedisRlStore({ limiter }) }));
    a.get("/ok", (req, res) => res.send("ok"));
    const get = await t.listen(a);
    const got = [];
    for (let i = 0; i < 3; i++) got.push(await get("/ok"));
    assert.deepEqual(got.map((r) => r.status), [200, 200, 429]);
    assert.deepEqual(got.map((r) => r.headers.get("ratelimit-remaining")), ["1", "0", "0"]);
    assert.deepEqual(t.erlLog, []); // no ERR_ERL_DOUBLE_COUNT
  }));

  test(`${name}: two limiters sharing one Redis key are refused with an error naming it`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    const a = express();
    for (let i = 0; i < 2; i++) {
      a.use(rateLimit({ windowMs: WINDOW_MS, limit: 3, logger: t.logger(), store: new RedisRlStore({ limiter, prefix: "same:" }) }));
    }
    a.get("/ok", (req, res) => res.send("ok"));
    a.use((err, req, res, next) => res.status(500).send(err.message)); // eslint-disable-line no-unused-vars
    const r = await (await t.listen(a))("/ok");
    assert.equal(r.status, 500);
    assert.match(await r.text(), /two express-rate-limit limiters use the Redis key same:.* give each RedisRlStore its own prefix/);
  }));

  test(`${name}: limit functions (sync and async) by tier, with the store's limit by key`, () => withSetup(async (t) => {
    const limiter = await t.limiter((await t.server()).port);
    const tier = (user) => (user === "gold" ? 4 : 2);
    for (const limit of [(req) => tier(req.headers["x-user"]), async (req) => tier(req.headers["x-user"])]) {
      const get = await t.listen(app(express, t, {
        limit, keyGenerator: (req) => req.headers["x-user"],
        store: new RedisRlStore({ limiter, limit: async (key) => tier(key), prefix: `tiers${limit.constructor.name}:` }),
      }));
      for (const [user, allowed] of [["gold", 4], ["free", 2]]) {
        const got = [];
        for (let i = 0; i < allowed + 2; i++) got.push((await get("/ok", { "x-user": user })).status);
        assert.deepEqual(got, [...repeat(200, allowed), 429, 429], user);
      }
    }
    assert.deepEqual(t.erlLog, []);
  }));

  test(`${name}: a limit function of the request without withRequest counts hits per window, never a 500`, () => withSetup(async (t) => {
    for (const module of [true, false]) {
      const limiter = await t.limiter((await t.server(module)).port);
      // Tiers by request: 3 for alice, 5 for anyone else, decided by express-rate-limit.
      const limit = async (req) => (req.headers["x-user"] === "alice" ? 3 : 5);
      const get = await t.listen(app(express, t, { limit, keyGenerator: (req) => req.headers["x-user"],
        store: new RedisRlStore({ limiter }) }));
      const windowEnd = (Math.floor(Date.now() / WINDOW_MS) + 1) * WINDOW_MS;
      if (windowEnd - Date.now() < 3000) await new Promise((r) => setTimeout(r, windowEnd - Date.now() + 50));
      for (const [user, allowed] of [["alice", 3], ["bob", 5]]) {
        const got = [];
        for (let i = 0; i < allowed + 2; i++) got.push((await get("/ok", { "x-user": user })).status);
        assert.deepEqual(got, [...repeat(200, allowed), 429, 429], `${user} module=${module}`);
      }
      const [source] = Object.entries(limiter.counters).filter(([k, v]) => v > 0 && ["redis", "lua"].includes(k)).map(([k]) => k);
      assert.equal(source, module ? "redis" : "lua");
    }
  }));

  test(`${name}: a limit function of the request on an unwrapped middleware is reported at startup, a wrapped one is not`, async () => {
    const logs = [];
    const limiter = { logger: { warn: (m) => logs.push(m) } }; // init reaches no server
    const options = { windowMs: 60_000, limit: () => 3, standardHeaders: "draft-8", legacyHeaders: false, validate: false };
    withRequest(rateLimit({ ...options, store: new RedisRlStore({ limiter }) }));
    rateLimit({ ...options, limit: 3, store: new RedisRlStore({ limiter }) }); // a number: nothing to wrap
    rateLimit({ ...options, store: new RedisRlStore({ limiter, limit: () => 3 }) }); // tiers by key
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(logs, []);
    rateLimit({ ...options, store: new RedisRlStore({ limiter }) });
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(logs, [UNWRAPPED_WARNING]);
  });

  // express-rate-limit's limit(req, res), sync and async, on limiters wrapped by withRequest:
  // a per-user tier (gold 4, others 2) stacked before a limit of 6 over all users, both
  // stores side by side. Each case: options, [user, path] requests, the statuses expected.
  const tierCases = [
    ["no skipping", {}, [...repeat(["gold", "/ok"], 5), ...repeat(["free", "/ok"], 3), ["other", "/ok"]],
      [200, 200, 200, 200, 429, 200, 200, 429, 429]],
    ["skipFailedRequests", { skipFailedRequests: true }, [...repeat(["gold", "/fail"], 5), ...repeat(["gold", "/ok"], 5)],
      [...repeat(500, 5), 200, 200, 200, 200, 429]],
    ["skipSuccessfulRequests", { skipSuccessfulRequests: true }, [...repeat(["free", "/ok"], 5), ...repeat(["free", "/fail"], 3)],
      [...repeat(200, 5), 500, 500, 429]],
  ];
  for (const [title, options, requests, expected] of tierCases) {
    test(`${name}: limit(req, res) per request through withRequest, ${title}, stacked, as MemoryStore does`, () => withSetup(async (t) => {
      const limiter = await t.limiter((await t.server()).port);
      const tierSync = (req, res) => (req.headers["x-user"] === "gold" && res.req === req ? 4 : 2);
      const tierAsync = async (req, res) => tierSync(req, res);
      const build = (store) => {
        const a = express();
        const common = { windowMs: WINDOW_MS, standardHeaders: "draft-6", legacyHeaders: false, logger: t.logger(), ...options };
        a.use(withRequest(rateLimit({ ...common, limit: tierAsync, keyGenerator: (req) => req.headers["x-user"], store: store() })));
        a.use(withRequest(rateLimit({ ...common, limit: () => 6, keyGenerator: () => "all", store: store() })));
        a.get("/ok", (req, res) => res.send("ok"));
        a.get("/fail", (req, res) => res.status(500).send("boom"));
        return a;
      };
      const run = async (get) => {
        const out = [];
        for (const [user, path] of requests) out.push((await get(path, { "x-user": user })).status);
        return out;
      };
      const ours = await run(await t.listen(build(() => new RedisRlStore({ limiter }))));
      const memory = await run(await t.listen(build(() => new MemoryStore())));
      assert.deepEqual(memory, expected, "MemoryStore");
      assert.deepEqual(ours, expected, "RedisRlStore");
      assert.deepEqual(t.erlLog, []);
      // Each limit its own bucket, under its own default prefix.
      const keys = (await limiter.redis.send(["KEYS", "rl:erl:*"])).map(String).sort();
      assert.ok(keys.every((k) => /^rl:erl:(4\/100000ms:gold|2\/100000ms:(free|other)|6\/100000ms:all)$/.test(k)), keys.join());
    }));
  }

  test(`${name}: totalHits and resetTime are valid under every failure policy`, () => withSetup(async (t) => {
    const s = await t.server(false);
    await s.stop(); // an outage: nothing listens on the port
    for (const [onError, expected] of [["open", repeat(200, 5)], ["closed", repeat(429, 5)], ["local", [200, 200, 200, 429, 429]]]) {
      const limiter = await t.limiter(s.port, { onError, timeoutMs: 200 });
      const get = await t.listen(app(express, t, { standardHeaders: "draft-7", store: new RedisRlStore({ limiter }) }));
      assert.deepEqual(await statuses(get, repeat("/ok", 5)), expected, onError);
    }
    assert.deepEqual(t.erlLog, []); // no ERR_ERL_INVALID_HITS, no reset-time warning
  }));
}
