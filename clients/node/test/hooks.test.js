// Every hook of the rateLimit middleware (key, limit, cost, skip, onLimited) may be sync or
// async: what it gives is awaited, and what it throws or rejects reaches Express's error
// handler. In an Express app on a real socket against the module.
import { test } from "node:test";
import assert from "node:assert/strict";
import express from "express";
import Redis from "ioredis";
import { Limit, Limiter } from "../src/index.js";
import { rateLimit } from "../src/middleware.js";
import { withCleanups } from "./servers.js";

const FREE = new Limit(0.01, 2), GOLD = new Limit(0.01, 4); // no refill during a test
const later = (value) => new Promise((r) => setTimeout(() => r(value), 1));
const sync = (f) => f;
const async = (f) => (...args) => later().then(() => f(...args));

async function setup(scope, options) {
  const s = await scope.server();
  const c = new Redis({ port: s.port, host: "127.0.0.1", enableOfflineQueue: false });
  c.on("error", () => {});
  scope.defer(() => c.disconnect());
  const limiter = new Limiter(c, { onError: "closed", logger: { warn() {} } });
  const a = express();
  a.use(rateLimit({ limiter, ...options }));
  a.get("/", (req, res) => res.send("ok"));
  a.get("/health", (req, res) => res.send("up"));
  a.use((err, req, res, next) => res.status(500).send(`error: ${err.message}`)); // eslint-disable-line no-unused-vars
  const http = await new Promise((r) => { const h = a.listen(0, "127.0.0.1", () => r(h)); });
  scope.defer(() => new Promise((r) => { http.closeAllConnections?.(); http.close(r); }));
  const get = async (path, user) => {
    const r = await fetch(`http://127.0.0.1:${http.address().port}${path}`, { headers: { "x-user": user } });
    return [r.status, await r.text()];
  };
  return { get, limiter };
}

for (const [kind, wrap] of [["sync", sync], ["async", async]]) {
  test(`${kind} hooks: a key, limit and cost per user, skip and onLimited`, () => withCleanups(async (scope) => {
    const { get } = await setup(scope, {
      key: wrap((req) => `user:${req.headers["x-user"]}`),
      limit: wrap((req) => (req.headers["x-user"] === "gold" ? GOLD : FREE)),
      cost: wrap((req) => (req.headers["x-user"] === "heavy" ? 2 : 1)),
      skip: wrap((req) => req.path === "/health"),
      onLimited: wrap((req, res, d) => res.status(429).send(`wait ${d.retryAfterMs > 0}`)),
    });
    const run = async (user, n, path = "/") => {
      const out = [];
      for (let i = 0; i < n; i++) out.push((await get(path, user))[0]);
      return out;
    };
    // Each user its own bucket (not one shared "[object Promise]"), at its own tier.
    assert.deepEqual(await run("alice", 3), [200, 200, 429]);
    assert.deepEqual(await run("bob", 3), [200, 200, 429]);
    assert.deepEqual(await run("gold", 5), [200, 200, 200, 200, 429]);
    assert.deepEqual(await run("heavy", 2), [200, 429]); // cost 2 of a burst of 2
    assert.deepEqual(await run("alice", 3, "/health"), [200, 200, 200]); // skipped
    assert.deepEqual(await get("/", "alice"), [429, "wait true"]); // onLimited's own response
  }));

  test(`${kind} hooks that throw reach the error handler`, () => withCleanups(async (scope) => {
    const boom = wrap(() => { throw new Error("hook failed"); });
    for (const hook of ["key", "limit", "cost", "skip"]) {
      const { get } = await setup(scope, { limit: FREE, [hook]: boom });
      assert.deepEqual(await get("/", "alice"), [500, "error: hook failed"], hook);
    }
    const { get } = await setup(scope, { limit: new Limit(0.01, 1), onLimited: boom });
    assert.equal((await get("/", "alice"))[0], 200);
    assert.deepEqual(await get("/", "alice"), [500, "error: hook failed"], "onLimited");
  }));
}

test("a limit function must give a Limit", () => withCleanups(async (scope) => {
  const { get } = await setup(scope, { limit: async () => 5 });
  assert.deepEqual(await get("/", "alice"), [500, "error: rateLimit: limit must give a Limit (new Limit(...))"]);
}));
