// Leases and reservations through the library, on real servers: withLease released on a thrown
// error, waiting for a slot, renewed while the work runs; reserve/settle exact against the
// module's own commands; the failure policy with a stopped server; and the middleware's
// in-flight limit in Express apps (200 concurrent requests, a streamed body, a client that
// goes). On ioredis 5 and 6 and node-redis 4, 5 and 6; the fallback paths (the script and the
// Functions library) where the server has no module.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { request } from "node:http";
import express from "express";
import express4 from "express4";
import Redis from "ioredis";
import Redis6 from "ioredis6";
import { createClient } from "redis";
import { createClient as createClient4 } from "redis4";
import { createClient as createClient6 } from "redis6";
import {
  LeaseTimeoutError, Limit, Limiter, ReservationNotOpenError, WaitTimeoutError, loadFunctions,
} from "../src/index.js";
import { rateLimit } from "../src/middleware.js";
import { Server, admin, withCleanups } from "./servers.js";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const quiet = { warn() {}, error() {}, info() {} };

const ioredis = (Client) => async (port, scope) => {
  const c = new Client({ port, host: "127.0.0.1", retryStrategy: () => 50, enableOfflineQueue: false });
  c.on("error", () => {});
  scope.defer(() => c.disconnect());
  await new Promise((r) => c.once("ready", r));
  return c;
};
const nodeRedis = (create) => async (port, scope) => {
  const c = create({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 }, disableOfflineQueue: true });
  c.on("error", () => {});
  await c.connect();
  scope.defer(() => c.disconnect().catch(() => {}));
  return c;
};
const CLIENTS = {
  "ioredis 5": ioredis(Redis),
  "ioredis 6": ioredis(Redis6),
  "node-redis 4": nodeRedis(createClient4),
  "node-redis 5": nodeRedis(createClient),
  "node-redis 6": nodeRedis(createClient6),
};

/** RL.LEASES's in_use on the module, or ZCOUNT of the unexpired members on a fallback. */
async function held(port, key, module = true) {
  if (module) return Number((await admin(port, "RL.LEASES", key, "1"))[0]);
  const nowUs = Date.now() * 1000;
  return Number(await admin(port, "ZCOUNT", key, `(${nowUs}`, "+inf"));
}

/** Waits (at most 2 s) until `key` holds `n` leases: a release after a response is sent
 * reaches Redis a moment after the client has read it. */
async function heldBecomes(port, key, n, module = true) {
  const end = Date.now() + 2000;
  let now;
  while ((now = await held(port, key, module)) !== n && Date.now() < end) await sleep(10);
  return now;
}

const PATHS = [
  ["module", true, async () => {}],
  ["lua", false, async () => {}],
  ["functions", false, async (client) => { await loadFunctions(client); }],
];
for (const [kind, connect] of Object.entries(CLIENTS)) {
  test(`withLease on ${kind}: released when the function throws; waits for a slot; renewed while it runs`, () => withCleanups(async (scope) => {
    const server = await scope.server();
    const limiter = new Limiter(await connect(server.port, scope), { onError: "closed", logger: quiet });
    const boom = new Error("the work failed");
    await assert.rejects(limiter.withLease("jobs", 2, 30_000, async (lease) => {
      assert.equal(lease.source, "redis");
      assert.equal(await held(server.port, "jobs"), 1);
      throw boom;
    }), (error) => error === boom);
    assert.equal(await held(server.port, "jobs"), 0, "the lease was released after the throw");

    // A full key: no wait is one try; a short wait times out; a long one gets the slot when
    // the other lease expires (or, polling, as soon as it is released).
    const other = await limiter.lease("one", 1, 300);
    assert.ok(other.allowed);
    await assert.rejects(limiter.withLease("one", 1, 1000, () => "ran"), (e) => e instanceof LeaseTimeoutError &&
      e instanceof WaitTimeoutError && e.lease.inUse === 1 && e.lease.retryAfterMs > 0 && e.decision === e.lease);
    await assert.rejects(limiter.withLease("one", 1, 1000, () => "ran", { wait: 50 }), (e) => e instanceof LeaseTimeoutError &&
      /^no lease on "one" \(limit 1\) within 50 ms: 1 held/.test(e.message));
    const start = Date.now();
    assert.equal(await limiter.withLease("one", 1, 1000, async () => "ran", { wait: 3000 }), "ran");
    assert.ok(Date.now() - start >= 150, "the slot came when the other lease expired, not before");
    assert.equal(await held(server.port, "one"), 0);
    // A release frees a slot before the denial's retryAfterMs: a waiter polling sees it soon.
    const blocker = await limiter.lease("one", 1, 60_000);
    setTimeout(() => blocker.release(), 100);
    const polled = Date.now();
    assert.equal(await limiter.withLease("one", 1, 1000, () => "next", { wait: 5000 }), "next");
    assert.ok(Date.now() - polled < 2000, "taken soon after the release, not at the 60 s expiry");
    const aborted = new AbortController();
    const blocked = await limiter.lease("one", 1, 60_000);
    setTimeout(() => aborted.abort(new Error("gave up")), 50);
    await assert.rejects(limiter.withLease("one", 1, 1000, () => "ran", { wait: Infinity, signal: aborted.signal }), /gave up/);
    await blocked.release();

    // A function that outlives the ttl keeps its lease: renewed every ttl / 2.
    let lost;
    await limiter.withLease("long", 1, 200, async (lease) => {
      await sleep(700);
      assert.equal(await held(server.port, "long"), 1, "still held after 3.5 ttls");
      assert.equal((await limiter.lease("long", 1, 200)).allowed, false);
      lost = lease.lost;
    });
    assert.equal(lost, false);
    assert.equal(await held(server.port, "long"), 0);
  }));
}

test("lease, renew, release and leases reply as the module's commands", () => withCleanups(async (scope) => {
  const server = await scope.server();
  const limiter = new Limiter(await CLIENTS["ioredis 5"](server.port, scope), { onError: "closed", logger: quiet });
  const a = await limiter.lease("k", 2, 60_000);
  assert.deepEqual([a.allowed, a.inUse, a.expiresInMs, a.source], [true, 1, 60_000, "redis"]);
  assert.match(a.id, /^[0-9a-f]{16}$/);
  const b = await limiter.lease("k", 2, 60_000, "worker-7");
  const again = await limiter.lease("k", 2, 60_000, { id: "worker-7" });
  assert.deepEqual([b.id, again.id, again.inUse], ["worker-7", "worker-7", 2]);
  const denied = await limiter.lease("k", 2, 60_000);
  assert.deepEqual([denied.allowed, denied.id, denied.inUse, denied.expiresInMs], [false, "", 2, 0]);
  assert.ok(denied.retryAfterMs > 59_000 && denied.retryAfterMs <= 60_000, String(denied.retryAfterMs));
  assert.deepEqual(denied.headers(), { "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "Retry-After": "60" });
  const count = await limiter.leases("k", 3);
  assert.deepEqual([count.inUse, count.retryAfterMs, count.limit], [2, 0, 3]);
  assert.deepEqual(a.headers(), { "X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1" });
  assert.equal(await limiter.renew("k", "worker-7", 120_000), true);
  assert.ok((await limiter.leases("k", 1)).retryAfterMs > 119_000);
  assert.equal(await b.release(), true);
  assert.equal(await limiter.release("k", "worker-7"), false, "a second release finds nothing");
  assert.equal(await limiter.renew("k", "worker-7", 1000), false);
  assert.equal(await a.release(), true);
  assert.equal(await admin(server.port, "EXISTS", "k"), 0, "the last release deleted the key");
  await assert.rejects(limiter.lease("k", 0, 1000), /limit must be an integer from 1 to 10000/);
  await assert.rejects(limiter.lease("k", 1, 0), /ttl_ms must be an integer/);
  await assert.rejects(limiter.lease("k", 1, 10, "x".repeat(17)), /id must be 1 to 16 bytes/);
  await assert.rejects(limiter.lease("k", 1, 10, "local:7"), /id must not start with "open:" or "local:"/);
  await assert.rejects(limiter.reserve("b", new Limit(1, 1), 1, 10, "open:7"), /id must not start with/);
  await admin(server.port, "SET", "plain", "x");
  await assert.rejects(limiter.lease("plain", 1, 10), /WRONGTYPE/);
}));

test("reserve and settle: exact against RL.RESERVE and RL.SETTLE on a twin key; a settle applies once", () => withCleanups(async (scope) => {
  const server = await scope.server();
  const client = await CLIENTS["ioredis 5"](server.port, scope);
  const limiter = new Limiter(client, { onError: "closed", logger: quiet });
  const limit = new Limit(0.001, 100); // one token per 1000 s: nothing refills during the test
  const raw = (...args) => client.call(...args);
  for (const [estimate, actual] of [[4, 1], [2.5, 2.5], [3, 40.25], [1e-3, 0]]) {
    const r = await limiter.reserve("mine", limit, estimate, 60_000);
    const twin = await raw("RL.RESERVE", "twin", "0.001", "100", String(estimate), "60000");
    assert.deepEqual([r.allowed, r.remaining, r.retryAfterMs, r.source], [true, twin[2], twin[3], "redis"]);
    const s = await r.settle(actual);
    const [balance, retry, reset] = await raw("RL.SETTLE", "twin", "0.001", "100", twin[1], String(actual));
    assert.deepEqual([s.applied, s.remaining, s.retryAfterMs, s.source, s.limit], [true, balance, retry, "redis", limit]);
    assert.ok(Math.abs(s.resetAfterMs - reset) <= 50, `${s.resetAfterMs} vs ${reset}`);
    // Settled once: the same answer again without a call; the id is no longer open at Redis.
    assert.equal(await r.settle(actual), s);
    await assert.rejects(limiter.settle("mine", limit, r.id, actual), (e) => e instanceof ReservationNotOpenError &&
      e.message === `id ${r.id} is not an open reservation of this key (settled, expired or never made)`);
  }
  // Into debt: every take denied until the debt is repaid.
  const big = await limiter.reserve("debt", new Limit(1, 10), 2, 60_000, "big");
  assert.equal(big.id, "big");
  const s = await big.settle(12);
  assert.equal(s.remaining, -2);
  assert.ok(s.inDebt && s.retryAfterMs > 1900 && s.retryAfterMs <= 2000, String(s.retryAfterMs));
  const denied = await limiter.reserve("debt", new Limit(1, 10), 1, 60_000);
  assert.deepEqual([denied.allowed, denied.id], [false, ""]);
  await assert.rejects(denied.settle(1), /holds nothing to settle/);
  await assert.rejects(limiter.reserve("debt", new Limit(1, 10), 0, 1000), /estimate must be a number above 0/);
  await assert.rejects(limiter.settle("debt", new Limit(1, 10), "big", -1), /actual must be a finite number >= 0/);
}));

test("the failure policy decides leases and reservations with the server stopped", () => withCleanups(async (scope) => {
  const server = await scope.server();
  const client = await CLIENTS["ioredis 5"](server.port, scope);
  const limiters = Object.fromEntries(["open", "closed", "local"].map((p) =>
    [p, new Limiter(client, { onError: p, timeoutMs: 500, probeIntervalMs: 60_000, logger: quiet })]));
  const taken = await limiters.local.lease("k", 1, 60_000); // on Redis while it answers
  assert.equal(taken.source, "redis");
  await server.stop();

  const { open, closed, local } = limiters;
  const o = await open.lease("k", 1, 1000);
  assert.deepEqual([o.allowed, o.source], [true, "open"]);
  assert.match(o.id, /^open:[0-9a-f]{16}$/);
  assert.equal(await o.release(), false, "an open lease is held nowhere");
  assert.equal(await open.withLease("k", 1, 1000, () => "ran"), "ran");
  const or = await open.reserve("b", new Limit(1, 10), 4, 1000);
  assert.deepEqual([or.allowed, (await or.settle(1)).applied], [true, false]);
  assert.deepEqual([(await open.leases("k", 3)).inUse, open.counters.open >= 4], [0, true]);

  const c = await closed.lease("k", 1, 1000);
  assert.deepEqual([c.allowed, c.source, c.retryAfterMs], [false, "closed", 1000]);
  await assert.rejects(closed.withLease("k", 1, 1000, () => "ran"), LeaseTimeoutError);
  assert.equal((await closed.reserve("b", new Limit(1, 10), 4, 1000)).allowed, false);
  assert.ok(closed.counters.closed >= 3);

  // local: the limit per key in process, released and expiring as on Redis.
  const l1 = await local.lease("k", 2, 60_000);
  const l2 = await local.lease("k", 2, 150);
  const l3 = await local.lease("k", 2, 60_000);
  assert.deepEqual([l1.allowed, l2.allowed, l3.allowed, l3.inUse, l1.source], [true, true, false, 2, "local"]);
  assert.match(l1.id, /^local:[0-9a-f]{16}$/);
  assert.ok(l3.retryAfterMs > 0 && l3.retryAfterMs <= 150);
  await sleep(160);
  assert.equal((await local.leases("k", 2)).inUse, 1, "the 150 ms lease expired");
  assert.equal(await l1.release(), true);
  assert.equal((await local.leases("k", 2)).inUse, 0);
  const boom = new Error("failed");
  await assert.rejects(local.withLease("w", 1, 60_000, () => { throw boom; }), (e) => e === boom);
  assert.equal((await local.leases("w", 1)).inUse, 0, "released after the throw");
  assert.equal(await local.release("k", taken.id), false, "Redis's lease cannot be released while it is down");
  const r = await local.reserve("b", new Limit(0.001, 10), 4, 60_000);
  assert.deepEqual([r.allowed, r.remaining, r.source], [true, 6, "local"]);
  const s = await r.settle(1);
  assert.deepEqual([s.applied, s.remaining, s.retryAfterMs, s.source], [true, 9, 0, "local"]);
  assert.equal(await r.settle(1), s, "settled once");
  await assert.rejects(local.settle("b", new Limit(0.001, 10), r.id, 1), ReservationNotOpenError);
  const under = await local.reserve("b", new Limit(0.001, 10), 2, 60_000);
  assert.equal((await under.settle(12)).remaining, -3); // 9 - 2 reserved - 10 more used
  assert.ok(local.counters.local >= 6 && local.counters.outages === 1);
  // A Redis reservation cannot be settled while Redis is down: said, counted, not applied.
  const unapplied = await local.settle("b", new Limit(0.001, 10), "from-redis", 1);
  assert.deepEqual([unapplied.applied, local.counters.unappliedCharges], [false, 1]);
  // Once Redis is back, a local lease is still released in process.
  const l4 = await local.lease("k", 2, 60_000);
  assert.match(l4.id, /^local:/);
  await server.start();
  local.downSince = null; // as after a probe that found Redis again
  assert.equal(await l4.release(), true);
  assert.doesNotMatch(String(await admin(server.port, "INFO", "commandstats")), /cmdstat_rl\.release/i, "never sent to Redis");
}));

// The middleware's in-flight limit --------------------------------------------------------

/** An app whose handler counts the requests in it at once (max), each staying `ms`. */
function countingApp(makeApp, limiter, options) {
  const app = makeApp();
  const seen = { now: 0, max: 0, ran: 0 };
  app.use(rateLimit({ limiter, key: () => "tenant", ...options }));
  app.get("/", async (req, res) => {
    seen.now++;
    seen.ran++;
    seen.max = Math.max(seen.max, seen.now);
    await sleep(15);
    seen.now--;
    res.send("ok");
  });
  return { app, seen };
}

async function listen(app, scope) {
  const http = await new Promise((r) => { const h = app.listen(0, "127.0.0.1", () => r(h)); });
  scope.defer(() => new Promise((r) => { http.closeAllConnections?.(); http.close(r); }));
  return http.address().port;
}

/** A GET on its own connection: {status, headers, body}. */
function get(port, path = "/") {
  return new Promise((resolve, reject) => {
    const req = request({ port, host: "127.0.0.1", path, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d) => { body += d; });
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

const FRAMEWORKS = [["express 5", express], ["express 4", express4]];

for (const [kind, connect] of Object.entries(CLIENTS)) {
  for (const [framework, makeApp] of kind === "ioredis 5" ? FRAMEWORKS : FRAMEWORKS.slice(0, 1)) {
    test(`in-flight limit on ${kind}, ${framework}: 200 concurrent requests never exceed 10 in the handler; every lease released`,
      () => withCleanups(async (scope) => {
        const server = await scope.server();
        const limiter = new Limiter(await connect(server.port, scope), { onError: "closed", logger: quiet });
        const { app, seen } = countingApp(makeApp, limiter, { inFlight: { limit: 10, ttlMs: 30_000 } });
        const port = await listen(app, scope);
        const replies = await Promise.all(Array.from({ length: 200 }, () => get(port)));
        const ok = replies.filter((r) => r.status === 200);
        const limited = replies.filter((r) => r.status === 429);
        assert.equal(ok.length + limited.length, 200);
        assert.ok(seen.max <= 10, `${seen.max} requests were in the handler at once`);
        assert.equal(ok.length, seen.ran);
        assert.ok(ok.length >= 10, `only ${ok.length} allowed`);
        for (const r of limited) {
          assert.match(r.headers["retry-after"], /^\d+$/);
          assert.equal(r.headers["content-type"], "application/problem+json");
          assert.match(JSON.parse(r.body).detail, /^Too many requests in flight \(at most 10\); retry after \d+ s\.$/);
        }
        assert.equal(await heldBecomes(server.port, "rl:http:inflight:10:tenant", 0), 0, "every lease released");
        // With the rate limit too: a request the rate denies gives its slot back at once.
        const both = countingApp(makeApp, limiter, { inFlight: 5, limit: new Limit(0.001, 3), prefix: "both:" });
        const port2 = await listen(both.app, scope);
        const statuses = (await Promise.all(Array.from({ length: 20 }, () => get(port2)))).map((r) => r.status);
        assert.equal(statuses.filter((s) => s === 200).length, 3);
        assert.ok(both.seen.max <= 3);
        assert.equal(await heldBecomes(server.port, "both:inflight:tenant", 0), 0);
      }));
  }
}

test("in-flight limit: a streamed body holds its lease until it ends, renewed past the ttl; a client that goes releases it", () => withCleanups(async (scope) => {
  const server = await scope.server();
  const limiter = new Limiter(await CLIENTS["node-redis 5"](server.port, scope), { onError: "closed", logger: quiet });
  const app = express();
  let cut = null;
  app.use(rateLimit({ limiter, key: () => "t", inFlight: { limit: 1, ttlMs: 200 } }));
  app.get("/stream", async (req, res) => {
    res.write("first ");
    await sleep(700); // 3.5 ttls
    res.end("last");
  });
  const port = await listen(app, scope);
  const streamed = get(port, "/stream");
  await sleep(450);
  assert.equal(await held(server.port, "rl:http:inflight:1:t"), 1, "held mid-stream, after the ttl");
  const second = await get(port, "/stream");
  assert.equal(second.status, 429);
  assert.equal((await streamed).body, "first last");
  assert.equal(await heldBecomes(server.port, "rl:http:inflight:1:t", 0), 0);

  // A client that goes before the end: released at once, not after the ttl.
  const slow = new Limiter(await CLIENTS["ioredis 5"](server.port, scope), { onError: "closed", logger: quiet });
  const app2 = express();
  app2.use(rateLimit({ limiter: slow, key: () => "t", inFlight: [1, 60_000] }));
  app2.get("/hang", (req, res) => {
    res.write("started"); // never ends: the client goes
    res.on("close", () => { cut = Date.now(); });
  });
  const port2 = await listen(app2, scope);
  await new Promise((resolve, reject) => {
    const req = request({ port: port2, host: "127.0.0.1", path: "/hang", agent: false }, (res) => {
      res.once("data", () => { req.destroy(); resolve(); });
    });
    req.on("error", () => {});
    req.on("close", resolve);
    req.end();
    setTimeout(() => reject(new Error("no first chunk")), 5000);
  });
  assert.equal(await heldBecomes(server.port, "rl:http:inflight:1:t", 0), 0, "the client went: released");
  assert.ok(cut !== null, "the handler saw the connection close");
}));

// The fallbacks ---------------------------------------------------------------------------

for (const [path, module, prepare] of PATHS.slice(1)) {
  for (const kind of ["ioredis 5", "node-redis 5"]) {
    test(`on the ${path} path, ${kind}: leases, withLease released on a throw, reserve/settle, 200 requests under an in-flight limit of 10`, () => withCleanups(async (scope) => {
      const server = await scope.server(module);
      const client = await CLIENTS[kind](server.port, scope);
      await prepare(client);
      const limiter = new Limiter(client, { onError: "closed", logger: quiet });
      const a = await limiter.lease("k", 2, 60_000);
      assert.deepEqual([a.allowed, a.inUse, a.expiresInMs, a.source], [true, 1, 60_000, path]);
      assert.match(a.id, /^[0-9a-f]{16}$/, "the client drew the id");
      const b = await limiter.lease("k", 2, 60_000, "worker-7");
      assert.equal((await limiter.lease("k", 2, 60_000, "worker-7")).inUse, 2, "a retried id is answered as held");
      const denied = await limiter.lease("k", 2, 60_000);
      assert.deepEqual([denied.allowed, denied.id, denied.inUse], [false, "", 2]);
      assert.ok(denied.retryAfterMs > 59_000 && denied.retryAfterMs <= 60_000);
      assert.deepEqual([(await limiter.leases("k", 3)).inUse, await limiter.renew("k", "worker-7", 120_000)], [2, true]);
      assert.deepEqual([await b.release(), await b.release(), await a.release()], [true, false, true]);
      assert.equal(await admin(server.port, "EXISTS", "k"), 0, "the last release deleted the key");

      const boom = new Error("failed");
      await assert.rejects(limiter.withLease("jobs", 2, 30_000, async (lease) => {
        assert.equal(lease.source, path);
        assert.equal(await held(server.port, "jobs", false), 1);
        throw boom;
      }), (e) => e === boom);
      assert.equal(await held(server.port, "jobs", false), 0);

      const slow = new Limit(0.001, 100);
      const r = await limiter.reserve("b", slow, 4, 60_000);
      assert.deepEqual([r.allowed, r.remaining, r.source], [true, 96, path]);
      const s = await r.settle(1);
      assert.deepEqual([s.applied, s.remaining, s.retryAfterMs, s.source], [true, 99, 0, path]);
      await assert.rejects(limiter.settle("b", slow, r.id, 1), (e) => e instanceof ReservationNotOpenError &&
        e.message === `id ${r.id} is not an open reservation of this key (settled, expired or never made)`);
      const big = await limiter.reserve("debt", new Limit(1, 10), 2, 60_000);
      assert.equal((await big.settle(12)).remaining, -2);

      const { app, seen } = countingApp(express, limiter, { inFlight: 10 });
      const port = await listen(app, scope);
      const replies = await Promise.all(Array.from({ length: 200 }, () => get(port)));
      assert.ok(seen.max <= 10, `${seen.max} in the handler at once`);
      assert.equal(replies.filter((x) => x.status === 200).length, seen.ran);
      assert.ok(seen.ran >= 10);
      assert.equal(await heldBecomes(server.port, "rl:http:inflight:10:tenant", 0, false), 0);
      assert.equal(limiter.path, path);
    }));
  }
}

// Least privilege ---------------------------------------------------------------------------

const PERMISSIONS = JSON.parse(readFileSync(new URL("../../vectors/permissions.json", import.meta.url), "utf8"));
/** A user of `rules` on `port`, as docs/clients.md writes it, and an ioredis client as them. */
async function userClient(port, name, rules, scope) {
  await admin(port, "ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "resetchannels", "-@all", ...rules);
  const c = new Redis({ port, host: "127.0.0.1", username: name, password: "pw", enableReadyCheck: false });
  c.on("error", () => {});
  scope.defer(() => c.disconnect());
  return c;
}

for (const [path, module, rulesName] of [["module", true, "module"], ["functions", false, "functions"], ["lua", false, "script"]]) {
  test(`the ${path} path as a least-privilege user: the leases rules take, renew, count and release; the reservations rules reserve and settle`,
    () => withCleanups(async (scope) => {
      const server = await scope.server(module);
      if (path === "functions") await loadFunctions(await CLIENTS["ioredis 5"](server.port, scope));
      const rules = PERMISSIONS.paths[rulesName];
      const leaser = new Limiter(await userClient(server.port, "leaser", [...PERMISSIONS.connection, ...rules.leases], scope),
        { onError: "closed", logger: quiet });
      const source = { module: "redis", functions: "functions", lua: "lua" }[path];
      const answered = await leaser.withLease("L", 1, 60_000, async (lease) => {
        assert.deepEqual([lease.allowed, lease.source], [true, source]);
        assert.equal((await leaser.leases("L", 1)).inUse, 1);
        assert.equal(await lease.renew(), true);
        return "ran";
      });
      assert.deepEqual([answered, (await leaser.leases("L", 1)).inUse, leaser.path, leaser.counters.misconfigured],
        ["ran", 0, path, 0]);
      const reserver = new Limiter(await userClient(server.port, "reserver",
        [...PERMISSIONS.connection, ...rules.decide, ...rules.tables, ...rules.reservations], scope), { onError: "closed", logger: quiet });
      const r = await reserver.reserve("B", new Limit(0.001, 3), 2, 60_000);
      assert.deepEqual([r.allowed, r.remaining, r.source], [true, 1, source]);
      assert.deepEqual([(await r.settle(1)).remaining, reserver.counters.misconfigured], [2, 0]);
    }));
}

test("in-flight limit: onLimited gets the denied Lease and the fields; a handler's error releases the slot", () => withCleanups(async (scope) => {
  const server = await scope.server();
  const limiter = new Limiter(await CLIENTS["ioredis 5"](server.port, scope), { onError: "closed", logger: quiet });
  const app = express();
  let release;
  const gate = new Promise((r) => { release = r; });
  app.use(rateLimit({
    limiter, key: () => "t", limit: new Limit(0.001, 100), inFlight: 1,
    onLimited: (req, res, lease, headers) => res.status(503).json({ inUse: lease.inUse, allowed: lease.allowed, headers }),
  }));
  app.get("/slow", async (req, res) => { await gate; res.send("done"); });
  app.get("/fail", () => { throw new Error("handler failed"); });
  app.use((error, req, res, next) => res.status(500).send(error.message)); // four arguments: an error handler
  const port = await listen(app, scope);
  const slow = get(port, "/slow");
  await sleep(100);
  const limited = await get(port, "/slow");
  const body = JSON.parse(limited.body);
  assert.deepEqual([limited.status, body.inUse, body.allowed], [503, 1, false]);
  assert.ok(body.headers.some(([n, v]) => n === "Retry-After" && /^\d+$/.test(v)));
  assert.ok(body.headers.some(([n]) => n === "RateLimit"), "the rate limit's own fields come too");
  release();
  assert.equal((await slow).body, "done");
  assert.equal(await heldBecomes(server.port, "rl:http:inflight:1:t", 0), 0);
  const failed = await get(port, "/fail");
  assert.deepEqual([failed.status, failed.body], [500, "handler failed"]);
  assert.equal(await heldBecomes(server.port, "rl:http:inflight:1:t", 0), 0, "released when the error response was sent");
}));
