// Tests for rate-limit.js (on the redis-rl library) against a real server with the module: `npm test` (node --test).
//
// REDIS_URL names the server (examples/run.sh starts one). Nothing here starts Redis. Keys are
// unique per run, and rates so slow (0.001 token/s) that no bucket refills during the test.

import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { rateLimit, makeClient, hello } from "./rate-limit.js";

/** Serves `limiter` + `hello` on a free port; resolves to a GET function and a close. */
async function serve(limiter) {
  const server = http.createServer((req, res) => limiter(req, res, () => hello(req, res)));
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    get: async () => {
      const response = await fetch(`http://127.0.0.1:${port}/`);
      await response.text();
      return response;
    },
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

/** A redis:// URL on a port nobody listens on. */
async function deadUrl() {
  const probe = net.createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  return `redis://127.0.0.1:${port}`;
}

/** Captures warnings instead of printing them. */
function recorder() {
  const warnings = [];
  return { warnings, warn: (m) => warnings.push(m), debug: () => {} };
}

describe("with a server", () => {
  const url = process.env.REDIS_URL;
  assert.ok(url, "set REDIS_URL to a server with the module (examples/run.sh does)");
  const redis = makeClient(url, { timeoutMs: 2000 });
  before(() => new Promise((resolve) => redis.once("ready", resolve)));
  after(() => redis.quit());
  const unique = () => `node-example:${randomUUID()}`;

  test("allows the burst, then answers 429 with headers", async () => {
    const bucket = unique();
    const app = await serve(
      rateLimit({ redis, rate: 0.001, capacity: 3, key: () => bucket, onError: "closed" }),
    );
    try {
      for (const [remaining, reset] of [[2, 1000], [1, 2000], [0, 3000]]) {
        const response = await app.get();
        assert.equal(response.status, 200);
        assert.equal(response.headers.get("x-ratelimit-limit"), "3");
        assert.equal(response.headers.get("x-ratelimit-remaining"), String(remaining));
        // One token per 1000 s: full again 1000 s per token taken, rounded up.
        assert.equal(response.headers.get("x-ratelimit-reset"), String(reset));
        assert.equal(response.headers.get("retry-after"), null);
      }
      const refused = await app.get();
      assert.equal(refused.status, 429);
      // The next token is just under 1000 s away; seconds round up.
      assert.equal(refused.headers.get("retry-after"), "1000");
      assert.equal(refused.headers.get("x-ratelimit-limit"), "3");
      assert.equal(refused.headers.get("x-ratelimit-remaining"), "0");
      assert.equal(refused.headers.get("x-ratelimit-reset"), "3000");
    } finally {
      await app.close();
    }
  });

  test("a cost above capacity is 429 without Retry-After", async () => {
    const bucket = unique();
    const app = await serve(
      rateLimit({ redis, rate: 0.001, capacity: 3, cost: 4, key: () => bucket, onError: "open" }),
    );
    try {
      const refused = await app.get();
      assert.equal(refused.status, 429);
      assert.equal(refused.headers.get("retry-after"), null);
      assert.equal(refused.headers.get("x-ratelimit-remaining"), "3");
    } finally {
      await app.close();
    }
  });

  test("an error reply applies the policy too", async () => {
    // The key holds a string, so the server answers WRONGTYPE: no decision was made.
    const bucket = unique();
    await redis.set(`rl:${bucket}`, "not a bucket");
    try {
      for (const [onError, want] of [["open", 200], ["closed", 503]]) {
        const logger = recorder();
        const limiter = rateLimit({ redis, rate: 1, capacity: 5, key: () => bucket, onError, logger });
        const app = await serve(limiter);
        try {
          assert.equal((await app.get()).status, want, onError);
          assert.match(logger.warnings[0], /WRONGTYPE/);
        } finally {
          await app.close();
        }
      }
    } finally {
      await redis.del(`rl:${bucket}`);
    }
  });
});

describe("without a server", () => {
  test("fail open lets requests through, logged and counted", async () => {
    const logger = recorder();
    const redis = makeClient(await deadUrl(), { logger });
    const limiter = rateLimit({ redis, rate: 1, capacity: 5, onError: "open", logger });
    const app = await serve(limiter);
    try {
      for (let i = 0; i < 2; i++) {
        const response = await app.get();
        assert.equal(response.status, 200);
        assert.equal(response.headers.get("x-ratelimit-remaining"), null);
      }
      assert.deepEqual([limiter.failedOpen, limiter.failedClosed], [2, 0]);
      assert.equal(logger.warnings.length, 1); // once per outage
      assert.match(logger.warnings[0], /onError=open/);
    } finally {
      await app.close();
      redis.disconnect();
    }
  });

  test("fail closed refuses with 503, logged and counted", async () => {
    const logger = recorder();
    const redis = makeClient(await deadUrl(), { logger });
    const limiter = rateLimit({ redis, rate: 1, capacity: 5, onError: "closed", logger });
    const app = await serve(limiter);
    try {
      const response = await app.get();
      assert.equal(response.status, 503);
      assert.equal(response.headers.get("retry-after"), "1");
      assert.deepEqual([limiter.failedOpen, limiter.failedClosed], [0, 1]);
      assert.match(logger.warnings[0], /onError=closed/);
    } finally {
      await app.close();
      redis.disconnect();
    }
  });

  test("the policy must be chosen and limits valid", () => {
    const redis = { call: async () => assert.fail("no call expected") };
    assert.throws(() => rateLimit({ redis, rate: 1, capacity: 5 }), TypeError);
    for (const bad of [
      { onError: "maybe" },
      { rate: 0 },
      { capacity: 0 },
      { capacity: 4e9 },
      { cost: -1 },
    ]) {
      assert.throws(
        () => rateLimit({ redis, rate: 1, capacity: 5, onError: "open", ...bad }),
        /onError|rate|capacity|cost/,
        JSON.stringify(bad),
      );
    }
  });
});
