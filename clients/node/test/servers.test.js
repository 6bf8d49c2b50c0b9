// The limiter against real servers, through ioredis and through node-redis: with the module,
// without it (the Lua script), during outages (each policy, the counters, the log, the way
// back), and with the deny cache (calls counted by INFO commandstats).
import { test } from "node:test";
import assert from "node:assert/strict";
import Redis from "ioredis";
import { createClient } from "redis";
import { Limit, Limiter, ModuleMissingError } from "../src/index.js";
import { adapt } from "../src/adapter.js";
import { Server, calls } from "./servers.js";

const SLOW = new Limit(0.001, 5); // no refill can matter while a test runs
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const CLIENTS = {
  async ioredis(port) {
    // No offline queue: a command the limiter gave up on must not run after a reconnect.
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

/** Runs `body` with servers and limiters that are all closed afterwards. */
async function withSetup(body) {
  const cleanups = [];
  const ctx = {
    async server(module = true) {
      const s = await Server.start(module);
      cleanups.push(() => s.close());
      return s;
    },
    async client(server) {
      const c = await CLIENTS.ioredis(server.port);
      cleanups.push(c.close);
      return c;
    },
    async limiter(kind, server, options = {}) {
      const { client, close } = await CLIENTS[kind](server.port);
      cleanups.push(close);
      const logs = [];
      // A deadline generous enough for a loaded machine; the SIGSTOP test sets its own.
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

async function sequence(limiter) {
  const out = [];
  const one = new Limit(1, 5);
  for (const cost of [1, 2, 1, 1, 1, 6, 0, 2]) out.push(["acquire", await limiter.acquire("a", one, cost)]);
  out.push(["peek", await limiter.peek("a", one, 1)]);
  out.push(["refund", await limiter.refund("a", one, 2)]);
  out.push(["acquire", await limiter.acquire("a", one, 2)]);
  out.push(["acquire", await limiter.acquire("a", one, 1)]);
  const tagged = [["{t}s", new Limit(1, 2), 1], ["{t}h", new Limit(0.5, 3), 1], ["{t}s", new Limit(1, 2), 1]];
  for (let i = 0; i < 3; i++) out.push(["all", await limiter.acquireAll(tagged)]);
  // Exact decimals and N/S: 100 a minute, 3 per 10 s, 0.3 per second against cost 3 (the
  // double 0.3 would need a hair over 10 s), and tenths of a token.
  for (const [name, limit, costs] of [["m", new Limit(100, { per: 60 }), [60, 40, 1]], ["t", new Limit(3, { per: 10 }), [1, 1, 1, 1]],
    ["d", new Limit(0.3, 3), [3, 0.1]], ["c", new Limit(7, 0.3, { per: 3 }), [0.1, 0.1, 0.1, 0.1]]]) {
    for (const cost of costs) out.push([`acquire ${name}`, await limiter.acquire(name, limit, cost)]);
    out.push(["refund", await limiter.refund(name, limit, 0.1)]);
    out.push(["peek", await limiter.peek(name, limit, 0.1)]);
  }
  return out;
}

for (const kind of Object.keys(CLIENTS)) {
  test(`${kind}: acquire reports the module's reply`, () => withSetup(async (t) => {
    const limiter = await t.limiter(kind, await t.server());
    const first = await limiter.acquire("user:42", new Limit({ rate: 5, capacity: 10 }));
    assert.deepEqual([first.allowed, first.remaining, first.retryAfterMs, first.source], [true, 9, 0, "redis"]);
    assert.equal(limiter.path, "module");
    assert.deepEqual(first.headers(), { "X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "1" });
    for (let i = 0; i < 4; i++) await limiter.acquire("k", SLOW);
    assert.equal((await limiter.acquire("k", SLOW)).allowed, true);
    const denied = await limiter.acquire("k", SLOW);
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 990_000);
    assert.equal(denied.headers()["Retry-After"], String(Math.ceil(denied.retryAfterMs / 1000)));
    const impossible = await limiter.acquire("k", SLOW, 6);
    assert.equal(impossible.retryAfterMs, -1);
    assert.equal("Retry-After" in impossible.headers(), false);
  }));

  test(`${kind}: e notation reaches the module as exact decimals`, () => withSetup(async (t) => {
    // String writes 1e-7 and 1e+21: the module reads each exactly.
    const limiter = await t.limiter(kind, await t.server());
    const limit = new Limit(0.000001, 2e-7);
    assert.deepEqual(limit.args(), ["0.000001", "2e-7"]);
    const taken = [];
    for (let i = 0; i < 3; i++) taken.push((await limiter.acquire("e", limit, 1e-7)).allowed);
    assert.deepEqual(taken, [true, true, false]);
    const impossible = await limiter.acquire("e", new Limit(1, 1), 1e21);
    assert.deepEqual([impossible.allowed, impossible.retryAfterMs], [false, -1]);
  }));

  test(`${kind}: the Lua path gives the module's decisions for the same calls`, () => withSetup(async (t) => {
    const withModule = await t.limiter(kind, await t.server(true));
    const plain = await t.limiter(kind, await t.server(false));
    const t0 = performance.now();
    const expected = await sequence(withModule);
    const t1 = performance.now();
    const got = await sequence(plain);
    const tookMs = Math.ceil(Math.max(t1 - t0, performance.now() - t1));
    assert.equal(plain.path, "lua");
    // Five thirds per second: after 100 of a 100-a-minute limit, the next comes in 0.6 s (less
    // the time the calls took); and 0.3 per second refills 3 tokens in 10 s exactly.
    const denied = expected.filter(([op]) => op === "acquire m")[2][1];
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs <= 600 && denied.retryAfterMs >= 600 - tookMs - 1, String(denied.retryAfterMs));
    assert.equal(expected.find(([op]) => op === "acquire d")[1].resetAfterMs, 10_000);
    expected.forEach(([op, a], i) => {
      const b = got[i][1];
      const show = (x) => JSON.stringify(x, (k, v) => (k === "limit" ? undefined : v));
      const what = `${op} #${i}: module ${show(a)}, lua ${show(b)}`;
      assert.equal(a.allowed, b.allowed, what);
      const pairs = op === "all" ? a.decisions.map((d, j) => [d, b.decisions[j]]) : [[a, b]];
      if (op === "all") assert.equal(a.refusedIndex, b.refusedIndex, what);
      for (const [x, y] of pairs) {
        assert.equal(x.remaining, y.remaining, what);
        if (op !== "refund") {
          assert.equal(x.retryAfterMs < 0, y.retryAfterMs < 0, what);
          assert.ok(Math.abs(x.retryAfterMs - y.retryAfterMs) <= tookMs + 1, what);
        }
        assert.ok(Math.abs(x.resetAfterMs - y.resetAfterMs) <= tookMs + 1, what);
      }
      assert.equal(b.source, "lua");
    });
  }));

  test(`${kind}: withoutModule "refuse": check() rejects, a call is decided by the policy and counted misconfigured`, () => withSetup(async (t) => {
    const limiter = await t.limiter(kind, await t.server(false), { withoutModule: "refuse" });
    const errors = [];
    limiter.logger.error = (m) => errors.push(m);
    await assert.rejects(limiter.check(), ModuleMissingError);
    const d = await limiter.acquire("k", SLOW);
    assert.deepEqual([d.allowed, d.source], [false, "closed"]);
    assert.deepEqual([limiter.counters.misconfigured, limiter.counters.outages, limiter.counters.closed], [1, 0, 1]);
    assert.match(errors.at(-1), /no RL\.ACQUIRE/);
  }));

  for (const [onError, module] of [["open", true], ["closed", true], ["local", true], ["local", false]]) {
    test(`${kind}: outage with onError ${onError} (${module ? "module" : "lua"}), then back to Redis`, () => withSetup(async (t) => {
      const s = await t.server(module);
      const limiter = await t.limiter(kind, s, { onError, instances: 2, probeIntervalMs: 0 });
      const source = module ? "redis" : "lua";
      assert.equal((await limiter.acquire("warm", SLOW)).source, source);
      await s.stop();
      const limit = new Limit(0.001, 4);
      const down = [];
      for (let i = 0; i < 6; i++) down.push(await limiter.acquire("k", limit));
      assert.equal(limiter.logs.length, 1, limiter.logs.join("\n")); // once per outage
      assert.match(limiter.logs[0], new RegExp(`onError=${onError}`));
      assert.deepEqual(new Set(down.map((d) => d.source)), new Set([onError]));
      const allowed = down.map((d) => d.allowed);
      if (onError === "open") assert.deepEqual(allowed, [true, true, true, true, true, true]);
      if (onError === "closed") assert.deepEqual(allowed, [false, false, false, false, false, false]);
      // "open" and "closed" know the limit, not what is left: X-RateLimit-Limit (and
      // Retry-After) only, as in Python, never "0 left, full again now".
      if (onError === "open") assert.deepEqual(down[0].headers(), { "X-RateLimit-Limit": "4" });
      if (onError === "closed") assert.deepEqual(down[0].headers(), { "X-RateLimit-Limit": "4", "Retry-After": "1" });
      if (onError === "local") assert.deepEqual(allowed, [true, true, false, false, false, false]);
      assert.equal(limiter.counters[onError], 6);
      assert.equal(limiter.counters.outages, 1);
      await s.start();
      const end = Date.now() + 15_000;
      let back;
      while ((back = await limiter.acquire("k", limit)).source !== source) {
        assert.ok(Date.now() < end, "decisions did not return to Redis");
        await sleep(50);
      }
      assert.equal(back.remaining, 3); // the restarted server has no data
      assert.match(limiter.logs.at(-1), /answers again/);
    }));
  }

  test(`${kind}: a server that does not answer times out into the policy`, () => withSetup(async (t) => {
    const s = await t.server();
    const limiter = await t.limiter(kind, s, { onError: "open", timeoutMs: 100, probeIntervalMs: 0 });
    assert.equal((await limiter.acquire("k", SLOW)).source, "redis");
    process.kill(s.proc.pid, "SIGSTOP"); // accepts nothing, answers nothing
    let d;
    try {
      d = await limiter.acquire("k", SLOW);
    } finally {
      process.kill(s.proc.pid, "SIGCONT");
    }
    assert.equal(d.source, "open");
    assert.match(limiter.logs[0], /no reply within 100 ms/);
  }));

  test(`${kind}: OOM and READONLY replies apply the policy`, () => withSetup(async (t) => {
    for (const module of [true, false]) {
      const s = await t.server(module);
      const limiter = await t.limiter(kind, s, { onError: "closed", probeIntervalMs: 0 });
      const admin = adapt((await t.client(s)).client);
      assert.equal((await limiter.acquire("k", SLOW)).allowed, true);
      await admin.send(["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
      await admin.send(["CONFIG", "SET", "maxmemory", "1"]);
      assert.equal((await limiter.acquire("k2", SLOW)).source, "closed", `OOM, module=${module}`);
      await admin.send(["CONFIG", "SET", "maxmemory", "0"]);
      assert.notEqual((await limiter.acquire("k2", SLOW)).source, "closed");
      await admin.send(["REPLICAOF", "127.0.0.1", "1"]);
      assert.equal((await limiter.acquire("k3", SLOW)).source, "closed", `READONLY, module=${module}`);
      assert.equal(limiter.counters.outages, 2);
      assert.match(limiter.logs.at(-1), /READONLY/);
    }
  }));

  test(`${kind}: the deny cache keeps a denied key off the server`, () => withSetup(async (t) => {
    for (const [module, denyCache, expected] of [[true, true, 2], [false, true, 2], [true, false, 201]]) {
      const s = await t.server(module);
      const limiter = await t.limiter(kind, s, { denyCache });
      const limit = new Limit(0.001, 1);
      assert.equal((await limiter.acquire("hot", limit)).allowed, true);
      const decisions = [];
      for (let i = 0; i < 200; i++) decisions.push(await limiter.acquire("hot", limit));
      assert.ok(decisions.every((d) => !d.allowed));
      const admin = adapt((await t.client(s)).client);
      // On the Lua path the first EVALSHA answered NOSCRIPT (then EVAL): one more call.
      const reached = module ? await calls(admin, "rl.acquire") : (await calls(admin, "evalsha")) + (await calls(admin, "eval"));
      assert.equal(reached, module ? expected : expected + 1, `module=${module} denyCache=${denyCache}`);
      if (denyCache) {
        assert.equal(limiter.counters.cache, 199);
        await limiter.refund("hot", limit);
        assert.equal((await limiter.acquire("hot", limit)).source, module ? "redis" : "lua");
      }
    }
  }));
}
