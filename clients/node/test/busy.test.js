// Busy is not down: a burst of concurrent calls on one connection, a connection still
// opening, and a slow reply under load get Redis's answers, not the failure policy; only an
// outage (a stopped server, an unreachable port) gets the policy, within the deadline.
import { test } from "node:test";
import assert from "node:assert/strict";
import Redis from "ioredis";
import Redis6 from "ioredis6";
import { createClient } from "redis";
import { createClient as createClient4 } from "redis4";
import { createClient as createClient6 } from "redis6";
import { createRequire } from "node:module";
import { Limit, Limiter, DEFAULT_TIMEOUT_MS } from "../src/index.js";
import { Server, withCleanups } from "./servers.js";

const N = 1000;
const HALF = new Limit(0.001, N / 2); // no refill during a test: exactly N/2 of N allowed

// Clients as the README builds them: no offline queue, and no wait for "ready" before the
// first call (the limiter must wait for a connection still opening).
const CLIENTS = {
  "ioredis 5"(port, scope) {
    return ioredis(Redis, port, scope);
  },
  "ioredis 6"(port, scope) {
    return ioredis(Redis6, port, scope);
  },
  "node-redis 6"(port, scope) {
    return nodeRedis(createClient6, port, scope);
  },
  "node-redis 5"(port, scope) {
    return nodeRedis(createClient, port, scope);
  },
  "node-redis 4"(port, scope) {
    return nodeRedis(createClient4, port, scope);
  },
};

function ioredis(Client, port, scope) {
  const c = new Client({ port, host: "127.0.0.1", enableOfflineQueue: false, retryStrategy: () => 50 });
  c.on("error", () => {});
  scope.defer(() => c.disconnect());
  return c;
}

function nodeRedis(createClient, port, scope, options = {}) {
  {
    const c = createClient({ socket: { port, host: "127.0.0.1", reconnectStrategy: () => 50 }, disableOfflineQueue: true, ...options });
    c.on("error", () => {});
    c.connect().catch(() => {}); // not awaited: the first calls find it still opening
    scope.defer(() => (c.destroy ? c.destroy() : c.disconnect().catch(() => {})));
    return c;
  }
}

// The versions these tests ran on must be the ones package.json promises (peerDependencies):
// ioredis 5 and 6 and node-redis 4, 5 and 6, each major tested above.
test("the tested client versions are the declared peer ranges", () => {
  const require = createRequire(import.meta.url);
  const pkg = require("../package.json");
  const majors = (range) => range.split("||").map((r) => Number(/^\s*\^(\d+)\s*$/.exec(r)[1]));
  const major = (name) => Number(require(`${name}/package.json`).version.split(".")[0]);
  assert.deepEqual(majors(pkg.peerDependencies.ioredis), [major("ioredis"), major("ioredis6")]);
  assert.deepEqual(majors(pkg.peerDependencies.redis), [major("redis4"), major("redis"), major("redis6")]);
});

function limiterOn(client, onError) {
  const logs = [];
  const limiter = new Limiter(client, { onError, logger: { warn: (m) => logs.push(m) } });
  limiter.logs = logs;
  return limiter;
}

/** N concurrent acquires on one key: each reply from Redis, exactly N/2 allowed. */
async function burst(limiter, key) {
  const decisions = await Promise.all(Array.from({ length: N }, () => limiter.acquire(key, HALF)));
  const sources = new Set(decisions.map((d) => d.source));
  assert.deepEqual(sources, new Set(["redis"]), limiter.logs.join("\n"));
  assert.equal(decisions.filter((d) => d.allowed).length, N / 2);
  const remaining = decisions.filter((d) => d.allowed).map((d) => d.remaining).sort((a, b) => a - b);
  assert.deepEqual(remaining, Array.from({ length: N / 2 }, (_, i) => i)); // each token once
}

test("the default deadline fits a web request, not a round trip", () => {
  assert.ok(DEFAULT_TIMEOUT_MS >= 1000 && DEFAULT_TIMEOUT_MS <= 2000, String(DEFAULT_TIMEOUT_MS));
  const limiter = new Limiter(new Redis({ lazyConnect: true }), { onError: "open" });
  assert.equal(limiter.timeoutMs, DEFAULT_TIMEOUT_MS);
});

for (const kind of Object.keys(CLIENTS)) {
  for (const onError of ["open", "closed", "local"]) {
    test(`${kind}, onError ${onError}: ${N} concurrent first calls, then ${N} warm, all answered by the module`, () => withCleanups(async (scope) => {
      const s = await scope.server();
      const limiter = limiterOn(CLIENTS[kind](s.port, scope), onError);
      await burst(limiter, "first"); // connection opening, module not yet detected
      await burst(limiter, "warm");
      for (const policy of ["open", "closed", "local"]) assert.equal(limiter.counters[policy], 0, policy);
      assert.equal(limiter.counters.outages, 0);
      assert.equal(limiter.counters.redis, 2 * N);
      assert.deepEqual(limiter.logs, []);
    }));
  }

  test(`${kind}: the first call on a new client waits for it to connect`, () => withCleanups(async (scope) => {
    const s = await scope.server();
    const limiter = limiterOn(CLIENTS[kind](s.port, scope), "closed");
    const d = await limiter.acquire("k", HALF);
    assert.deepEqual([d.allowed, d.source], [true, "redis"], limiter.logs.join("\n"));
    assert.deepEqual(limiter.logs, []);
  }));

  // The deadline's own timer decides (its log line says so); no wall-clock bound is asserted,
  // and the test's timeout only stops a hang.
  test(`${kind}: an unreachable server gets the policy at the deadline, and the log says so`, { timeout: 60_000 }, () => withCleanups(async (scope) => {
    const s = await scope.server(false);
    await s.stop(); // nothing listens on its port now
    const client = CLIENTS[kind](s.port, scope);
    const logs = [];
    const limiter = new Limiter(client, { onError: "open", timeoutMs: 300, logger: { warn: (m) => logs.push(m) } });
    const decisions = await Promise.all(Array.from({ length: 50 }, () => limiter.acquire("k", HALF)));
    assert.deepEqual(new Set(decisions.map((d) => d.source)), new Set(["open"]));
    assert.equal(limiter.counters.outages, 1);
    assert.equal(logs.length, 1, logs.join("\n"));
    assert.match(logs[0], /not connected within 300 ms/);
  }));

  test(`${kind}: a server that stops answering mid-call gets the policy at the deadline`, { timeout: 60_000 }, () => withCleanups(async (scope) => {
    const s = await scope.server();
    const client = CLIENTS[kind](s.port, scope);
    const limiter = limiterOn(client, "closed");
    assert.equal((await limiter.acquire("k", HALF)).source, "redis");
    const fast = new Limiter(client, { onError: "closed", timeoutMs: 200, logger: { warn: (m) => limiter.logs.push(m) } });
    process.kill(s.proc.pid, "SIGSTOP");
    let d;
    try {
      d = await fast.acquire("k", HALF);
    } finally {
      process.kill(s.proc.pid, "SIGCONT");
    }
    assert.equal(d.source, "closed");
    assert.match(limiter.logs.at(-1), /no reply within 200 ms/);
  }));
}

// node-redis refuses a command at once when its queue holds commandsQueueMaxLength: a full
// queue is busy, not down, and the call waits for room within its deadline.
for (const [kind, create] of [["node-redis 6", createClient6], ["node-redis 5", createClient], ["node-redis 4", createClient4]]) {
  test(`${kind} with a queue of 10: ${N} concurrent calls wait for room and are all answered by the module`, () => withCleanups(async (scope) => {
    const s = await scope.server();
    const limiter = limiterOn(nodeRedis(create, s.port, scope, { commandsQueueMaxLength: 10 }), "closed");
    await burst(limiter, "first");
    await burst(limiter, "warm");
    assert.equal(limiter.counters.closed, 0);
    assert.deepEqual(limiter.logs, []);
  }));
}
