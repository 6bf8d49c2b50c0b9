// limiter.wait against real servers: 20 waiters on 5 tokens/s take turns at the rate, the
// timeout, "never", an AbortSignal (no token held afterwards: RL.PEEK), the Lua path, and an
// outage decided by the failure policy.
import { test } from "node:test";
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import Redis from "ioredis";
import { Limit, Limiter, WaitNeverError, WaitTimeoutError } from "../src/index.js";
import { Server, calls, withCleanups } from "./servers.js";

const FIVE = new Limit(5, 1); // one token every 200 ms, no burst
const SLOW = new Limit(0.001, 2); // no refill while a test runs
// Scheduling delay allowed on a loaded machine, in the contention test's upper bounds only.
const SLACK_MS = Number(process.env.RL_WAIT_SLACK_MS || 600);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** withCleanups, plus ioredis clients, limiters and RL.PEEK on a port. */
const withSetup = (body) => withCleanups(async (scope) => {
  const ctx = {
    ...scope,
    client(port) {
      const c = new Redis({ port, host: "127.0.0.1", retryStrategy: () => 50, enableOfflineQueue: false });
      c.on("error", () => {});
      scope.defer(() => c.disconnect());
      return c;
    },
    async limiter(port, options = {}) {
      const c = ctx.client(port);
      if (options.connect !== false) await new Promise((r) => c.once("ready", r));
      return new Limiter(c, { onError: "closed", timeoutMs: 5000, logger: { warn() {} }, ...options });
    },
    async peekRemaining(port, key, limit) {
      const c = ctx.client(port);
      await new Promise((r) => c.once("ready", r));
      return (await c.call("RL.PEEK", key, ...limit.args(), "0"))[1];
    },
  };
  await body(ctx);
});

test("20 waiters on 5 tokens/s each get a token, at the bucket's rate", () => withSetup(async (t) => {
  const s = await t.server();
  const limiter = await t.limiter(s.port);
  const start = performance.now();
  const got = await Promise.all(Array.from({ length: 20 }, async () => {
    const d = await limiter.wait("vendor", FIVE);
    return [performance.now() - start, d];
  }));
  const times = got.map(([ms]) => ms).sort((a, b) => a - b);
  assert.ok(got.every(([, d]) => d.allowed && d.source === "redis"));
  // The bound: by any moment t after the start, at most 1 + 5 t tokens (1 ms: the clock's
  // resolution in the module's replies).
  times.forEach((ms, i) => assert.ok(ms >= i * 200 - 1, `token ${i} at ${ms} ms came early`));
  // No idle gap longer than a retry interval (200 ms + 10% jitter), plus SLACK_MS for a
  // loaded machine's scheduling (the times are read after the reply).
  const gaps = times.slice(1).map((ms, i) => ms - times[i]);
  assert.ok(Math.max(...gaps) < 200 + 22 + SLACK_MS, `gaps ${gaps}`);
  assert.ok(times[19] < 19 * (200 + 22) + SLACK_MS, `last at ${times[19]} ms`);
  assert.equal(await t.peekRemaining(s.port, "vendor", FIVE), 0);
}));

test("timeout rejects with the last denial; never rejects at once", () => withSetup(async (t) => {
  for (const module of [true, false]) {
    const limiter = await t.limiter((await t.server(module)).port);
    await limiter.acquire("k", SLOW, 2);
    let start = performance.now();
    await assert.rejects(limiter.wait("k", SLOW, { timeoutMs: 300 }), (e) => {
      assert.ok(e instanceof WaitTimeoutError);
      assert.equal(e.decision.allowed, false);
      assert.ok(e.decision.retryAfterMs > 900_000);
      return true;
    });
    const took = performance.now() - start;
    assert.ok(took >= 299 && took < 1000, `${took} ms`);
    start = performance.now();
    await assert.rejects(limiter.wait("k", SLOW, { cost: 3 }), (e) => e instanceof WaitNeverError && e.decision.retryAfterMs === -1);
    assert.ok(performance.now() - start < 500);
  }
}));

test("an aborted wait holds no token, whether it slept or its take was in flight", () => withSetup(async (t) => {
  const s = await t.server();
  const limiter = await t.limiter(s.port);
  const two = new Limit(2, 1); // a token every 500 ms
  await limiter.acquire("k", two);
  const controller = new AbortController();
  const waiting = limiter.wait("k", two, { signal: controller.signal });
  await sleep(100);
  controller.abort(new Error("shutting down"));
  await assert.rejects(waiting, /shutting down/);
  await sleep(600); // the token is back and nobody took it
  assert.equal(await t.peekRemaining(s.port, "k", two), 1);

  // Paused server: the take is sent, the abort comes, then the server answers "allowed".
  await limiter.peek("k2", SLOW);
  process.kill(s.proc.pid, "SIGSTOP");
  const racing = new AbortController();
  let raced;
  try {
    raced = limiter.wait("k2", SLOW, { signal: racing.signal });
    raced.catch(() => {});
    await sleep(200);
    racing.abort();
    await sleep(100);
  } finally {
    process.kill(s.proc.pid, "SIGCONT");
  }
  await assert.rejects(raced, { name: "AbortError" });
  assert.equal(await t.peekRemaining(s.port, "k2", SLOW), 2);
  const client = t.client(s.port);
  await new Promise((r) => client.once("ready", r));
  const send = { send: (args) => client.call(...args) };
  assert.equal(await calls(send, "rl.refund"), 1);
}));

test("the Lua path waits; an outage is decided by the failure policy", () => withSetup(async (t) => {
  const lua = await t.limiter((await t.server(false)).port);
  const ten = new Limit(10, 1);
  const start = performance.now();
  const got = [await lua.wait("k", ten), await lua.wait("k", ten), await lua.wait("k", ten)];
  assert.deepEqual(got.map((d) => d.source), ["lua", "lua", "lua"]);
  assert.ok(performance.now() - start >= 199);

  const dead = await Server.start(false);
  const port = dead.port;
  await dead.close();
  const closed = await t.limiter(port, { connect: false, timeoutMs: 100 });
  await assert.rejects(closed.wait("k", SLOW, { timeoutMs: 200 }), (e) => e instanceof WaitTimeoutError && e.decision.source === "closed");
  const local = await t.limiter(port, { connect: false, onError: "local", timeoutMs: 100 });
  assert.equal((await local.wait("k", SLOW)).source, "local");
}));
