// A misconfiguration is not an outage, on real servers through ioredis and node-redis: a wrong
// password, a user missing a permission (the path's command, or one the function runs), and
// a cluster client on a standalone server are each rejected by check() with a
// MisconfiguredError naming the cause, and at run time decided by the policy ("open" here),
// logged at error level once per cause and counted under misconfigured, never as an outage.
// A server that is merely down is not one: check() resolves to null, and the log names the
// real cause of the failed connection (ECONNREFUSED, ENOTFOUND) instead of a bare deadline.
// The single-node client on a cluster is in paths-cluster.test.js.
import { test } from "node:test";
import assert from "node:assert/strict";
import Redis from "ioredis";
import { createClient, createCluster } from "redis";
import { Limit, Limiter, MisconfiguredError, loadFunctions } from "../src/index.js";
import { BINARIES, withCleanups } from "./servers.js";
import { createUser, rulesOf } from "./paths.js";

const LIMIT = new Limit(0.001, 5);

/** A client to `port` as `user` with `password`, not waited for (a wrong password never opens). */
const CLIENTS = {
  ioredis(port, scope, { user, password, host = "127.0.0.1" } = {}) {
    const c = new Redis({ port, host, username: user, password, enableOfflineQueue: false, enableReadyCheck: false,
      retryStrategy: () => 50 });
    c.on("error", () => {});
    scope.defer(() => c.disconnect());
    return c;
  },
  "node-redis"(port, scope, { user, password, host = "127.0.0.1" } = {}) {
    const c = createClient({ socket: { port, host, reconnectStrategy: () => 50 }, username: user, password,
      disableOfflineQueue: true });
    c.on("error", () => {});
    c.connect().catch(() => {});
    scope.defer(() => c.destroy());
    return c;
  },
};

function limiterOf(client, options = {}) {
  const logs = { warn: [], error: [] };
  const limiter = new Limiter(client, {
    onError: "open", timeoutMs: 1000, logger: { warn: (m) => logs.warn.push(m), error: (m) => logs.error.push(m) }, ...options,
  });
  limiter.logs = logs;
  return limiter;
}

/** check() rejects with `cause`; then three calls are decided by "open", counted apart, logged once. */
async function misconfiguredThroughout(limiter, cause) {
  await assert.rejects(limiter.check(), (e) => e instanceof MisconfiguredError && cause.test(e.message), String(cause));
  const decisions = [];
  for (let i = 0; i < 3; i++) decisions.push(await limiter.acquire("k", LIMIT));
  assert.deepEqual(decisions.map((d) => [d.allowed, d.source]), [[true, "open"], [true, "open"], [true, "open"]]);
  assert.deepEqual([limiter.counters.misconfigured, limiter.counters.open, limiter.counters.outages], [3, 3, 0]);
  assert.equal(limiter.logs.error.length, 1, limiter.logs.error.join("\n")); // once a minute per cause
  assert.match(limiter.logs.error[0], cause);
  assert.match(limiter.logs.error[0], /misconfigured, not an outage/);
}

for (const [server, binary] of BINARIES) {
  for (const kind of Object.keys(CLIENTS)) {
    test(`${server}, ${kind}: a wrong password is a misconfiguration`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary, args: ["--requirepass", "pw"] });
      const limiter = limiterOf(CLIENTS[kind](s.port, scope, { password: "bad" }));
      await misconfiguredThroughout(limiter, /authentication failed \(WRONGPASS/);
    }));

    test(`${server}, ${kind}: a user without any path's command is told which rules to add`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary });
      await createUser([s.port], "app", [...rulesOf("functions")].filter((r) => !/fcall|eval/.test(r)));
      const limiter = limiterOf(CLIENTS[kind](s.port, scope, { user: "app", password: "pw" }));
      await misconfiguredThroughout(limiter,
        /NOPERM: this user may not run 'fcall_ro' \(nor 'evalsha', 'eval'\); add the ACL rules "\+fcall \+fcall_ro" or "\+evalsha \+eval" or see docs\/clients\.md#permissions/);
    }));

    test(`${server}, ${kind}: a user whose function may not run TIME is told so`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary });
      const c = new Redis({ port: s.port, host: "127.0.0.1" });
      scope.defer(() => c.disconnect());
      await loadFunctions(c);
      await createUser([s.port], "app", rulesOf("functions").filter((r) => r !== "+time"));
      const limiter = limiterOf(CLIENTS[kind](s.port, scope, { user: "app", password: "pw" }));
      // Valkey names the command; Redis 7 says only that the script may not run one.
      await misconfiguredThroughout(limiter, /NOPERM: the script or function may not run ('time'|a command the script runs)/);
    }));

    test(`${server}, ${kind}: a server that is down is an outage, and the log names why`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary });
      await s.stop();
      const limiter = limiterOf(CLIENTS[kind](s.port, scope), { timeoutMs: 300 });
      assert.equal(await limiter.check(), null);
      assert.match(limiter.logs.warn.at(-1), /ECONNREFUSED/);
      const d = await limiter.acquire("k", LIMIT);
      assert.deepEqual([d.source, limiter.counters.outages, limiter.counters.misconfigured], ["open", 1, 0]);
      assert.match(limiter.logs.warn.at(-1), /ECONNREFUSED/);
      assert.deepEqual(limiter.logs.error, []);
    }));
  }

  test(`${server}: an ioredis Cluster on a standalone server is a misconfiguration, not "open" forever`, () => withCleanups(async (scope) => {
    const s = await scope.server(false, { binary });
    const c = new Redis.Cluster([{ host: "127.0.0.1", port: s.port }], { clusterRetryStrategy: () => 50 });
    c.on("error", () => {});
    scope.defer(() => c.disconnect());
    await misconfiguredThroughout(limiterOf(c), /a cluster client on a server without cluster support/);
  }));

  test(`${server}: a node-redis cluster on a standalone server is a misconfiguration`, () => withCleanups(async (scope) => {
    const s = await scope.server(false, { binary });
    const c = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${s.port}` }] });
    c.on("error", () => {});
    const limiter = limiterOf(c); // before connect: it hears why connect fails
    await assert.rejects(c.connect());
    await misconfiguredThroughout(limiter, /a cluster client on a server without cluster support/);
  }));
}

test("an unknown host is named (ENOTFOUND) in the log, not a bare deadline", () => withCleanups(async (scope) => {
  const limiter = limiterOf(CLIENTS.ioredis(6390, scope, { host: "rl-no-such-host.invalid" }), { timeoutMs: 500 });
  assert.equal(await limiter.check(), null);
  assert.match(limiter.logs.warn.at(-1), /ENOTFOUND|EAI_AGAIN/);
}));
