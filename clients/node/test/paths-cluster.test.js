// The three paths on a cluster of its own (3 masters, a replica of the first), on Redis and on
// Valkey 9 (when target/servers has it), through ioredis's Cluster and node-redis's
// createCluster: the module (a cluster with it loaded), the Functions library (loadFunctions
// on every master) and the script, each as (a) the admin user, (b) a user with exactly the
// rules of clients/vectors/permissions.json (cluster rules included), (c) on nodes whose
// COMMAND is renamed away, (d) as a user refused SCRIPT LOAD, (e) as a user allowed FCALL only.
// Then: a single-node client on the cluster is a misconfiguration; acquireAcrossSlots is all
// or nothing over several slots; and 200 concurrent callers go through a SCRIPT FLUSH every
// 200 ms and a replica's failover with no error raised and no SCRIPT LOAD sent.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import Redis from "ioredis";
import { createClient, createCluster } from "redis";
import { FUNCTIONS_VERSION, Limit, Limiter, MisconfiguredError, keySlot, loadFunctions } from "../src/index.js";
import { BINARIES, Cluster, MODULE, admin } from "./servers.js";
import { createUser, exactCounts, quiet, rulesOf, sentNoProbe } from "./paths.js";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A cluster client to `cluster` as `user` (or the default user); closed by `closers`. */
const CLIENTS = {
  async ioredis(cluster, user, closers) {
    const c = new Redis.Cluster([{ host: "127.0.0.1", port: cluster.nodes[0].port }], {
      redisOptions: { enableReadyCheck: false, ...(user ? { username: user, password: "pw" } : {}) },
    });
    c.on("error", () => {});
    closers.push(() => c.disconnect());
    // ioredis's Cluster sends CLUSTER INFO before "ready" (its ready check): permissions.json's
    // cluster rules hold +cluster|info for it. A refusal emits nothing, so bound the wait.
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the ioredis Cluster was not ready within 10 s (user ${user})`)), 10_000);
      c.once("ready", () => { clearTimeout(timer); resolve(); });
    });
    return c;
  },
  async "node-redis"(cluster, user, closers) {
    const c = createCluster({
      rootNodes: [{ url: `redis://127.0.0.1:${cluster.nodes[0].port}` }],
      defaults: user ? { username: user, password: "pw" } : {},
    });
    c.on("error", () => {});
    await c.connect();
    closers.push(() => c.destroy());
    return c;
  },
};

/** Every node's INFO commandstats field `field` of `command`, summed. */
async function statSum(cluster, command, field = "calls") {
  let sum = 0;
  for (const n of cluster.nodes) {
    const line = String(await admin(n.port, "INFO", "commandstats")).split("\r\n").find((l) => l.startsWith(`cmdstat_${command}:`));
    sum += line ? Number(new RegExp(`${field}=(\\d+)`).exec(line)?.[1] ?? 0) : 0;
  }
  return sum;
}

/** The masters now (a failover changes them), by ROLE. */
async function masters(cluster) {
  const out = [];
  for (const n of cluster.nodes) if (String((await admin(n.port, "ROLE"))[0]) === "master") out.push(n);
  return out;
}

for (const [server, binary] of BINARIES) {
  describe(`${server} cluster`, { timeout: 120_000 }, () => {
    let plain, withModule;
    const closers = [];
    before(async () => {
      // COMMAND renamed away on every node of the plain cluster: (c) for every test on it.
      plain = await Cluster.start({ masters: 3, replicas: 1, binary, args: ["--rename-command", "COMMAND", ""] });
      withModule = await Cluster.start({ masters: 3, module: true, binary });
      await createUser(plain.nodes.map((n) => n.port), "noload", ["+@all", "-script|load"]);
      for (const [name, rules] of [["functions", "functions"], ["script", "script"]]) {
        await createUser(plain.nodes.map((n) => n.port), name, rulesOf(rules, { cluster: true }));
      }
      await createUser(withModule.nodes.map((n) => n.port), "module", rulesOf("module", { cluster: true }));
    });
    after(async () => {
      for (const close of closers.reverse()) await close();
      await plain?.close();
      await withModule?.close();
    });

    for (const kind of Object.keys(CLIENTS)) {
      test(`${kind}: the module, as admin and as a least-privilege user: exact counts`, async () => {
        for (const user of [null, "module"]) {
          const limiter = new Limiter(await CLIENTS[kind](withModule, user, closers), { onError: "closed", logger: quiet() });
          assert.equal(await limiter.check(), "module");
          await exactCounts(limiter, "module");
        }
        for (const n of withModule.nodes) await sentNoProbe(n.port);
      });

      test(`${kind}: the script, as admin, least privilege, and refused SCRIPT LOAD: exact counts, no COMMAND`, async () => {
        for (const m of await masters(plain)) await admin(m.port, "FUNCTION", "FLUSH");
        for (const user of [null, "script", "noload"]) {
          const limiter = new Limiter(await CLIENTS[kind](plain, user, closers), { onError: "closed", logger: quiet() });
          assert.equal(await limiter.check(), "lua", String(user));
          await exactCounts(limiter, "lua");
        }
        for (const n of plain.nodes) await sentNoProbe(n.port);
      });

      test(`${kind}: the Functions library on every master, as admin and as a user allowed FCALL only`, async () => {
        const loader = await CLIENTS[kind](plain, null, closers);
        assert.equal(await loadFunctions(loader), FUNCTIONS_VERSION);
        for (const m of await masters(plain)) assert.equal(Number(await admin(m.port, "FCALL_RO", "rl_version", "0")), FUNCTIONS_VERSION);
        const before = (await statSum(plain, "evalsha")) + (await statSum(plain, "eval"));
        for (const user of [null, "functions"]) {
          const limiter = new Limiter(await CLIENTS[kind](plain, user, closers), { onError: "closed", logger: quiet() });
          assert.equal(await limiter.check(), "functions", String(user));
          await exactCounts(limiter, "functions");
        }
        assert.equal((await statSum(plain, "evalsha")) + (await statSum(plain, "eval")), before);
        for (const n of plain.nodes) await sentNoProbe(n.port);
        for (const m of await masters(plain)) await admin(m.port, "FUNCTION", "FLUSH");
      });

      test(`${kind}: acquireAcrossSlots is all or nothing over keys in several slots`, async () => {
        const limiter = new Limiter(await CLIENTS[kind](plain, null, closers), { onError: "closed", logger: quiet() });
        const id = randomUUID();
        const keys = [`a:${id}`, `b:${id}`, `c:${id}`];
        assert.equal(new Set(keys.map(keySlot)).size, 3);
        const wide = new Limit(0.001, 5), narrow = new Limit(0.001, 1);
        const items = [[keys[0], wide], [keys[1], wide], [keys[2], narrow]];
        const first = await limiter.acquireAcrossSlots(items);
        assert.equal(first.allowed, true);
        assert.deepEqual(first.outcomes.map((o) => [o.status, o.decision.remaining]), [["taken", 4], ["taken", 4], ["taken", 0]]);
        // The narrow one refuses: whatever was taken before it is given back.
        const second = await limiter.acquireAcrossSlots(items);
        assert.equal(second.allowed, false);
        assert.equal(second.outcomes[2].status, "refused");
        for (const key of keys.slice(0, 2)) assert.equal((await limiter.peek(key, wide, 0)).remaining, 4, key);
        assert.ok(second.retryAfterMs > 0);
        // A shadow item's refusal is reported and does not refuse the call.
        const shadowed = await limiter.acquireAcrossSlots([[keys[0], wide], { key: keys[2], limit: narrow, shadow: true }]);
        assert.deepEqual([shadowed.allowed, shadowed.outcomes.map((o) => o.status)], [true, ["taken", "shadowRefused"]]);
        assert.equal((await limiter.peek(keys[0], wide, 0)).remaining, 3);
      });
    }

    for (const kind of ["ioredis", "node-redis"]) {
      test(`${kind}: a single-node client on the cluster is a misconfiguration (check rejects, calls counted apart)`, async () => {
        const port = plain.nodes[0].port;
        const client = kind === "ioredis"
          ? new Redis({ port, host: "127.0.0.1", enableReadyCheck: false })
          : createClient({ socket: { port, host: "127.0.0.1" } });
        client.on("error", () => {});
        if (kind === "node-redis") await client.connect();
        closers.push(() => (kind === "ioredis" ? client.disconnect() : client.destroy()));
        const errors = [];
        const limiter = new Limiter(client, { onError: "open", logger: { warn() {}, error: (m) => errors.push(m) } });
        await assert.rejects(limiter.check(), (e) => e instanceof MisconfiguredError && /single-node client on a Redis Cluster/.test(e.message));
        // Keys on every master: some answer, the others are MOVED, each counted as misconfigured.
        let moved = 0;
        for (let i = 0; i < 12; i++) {
          const d = await limiter.acquire(`single:${i}:${randomUUID()}`, new Limit(1, 5));
          if (d.source === "open") moved++;
        }
        assert.ok(moved > 0);
        assert.deepEqual([limiter.counters.misconfigured, limiter.counters.outages], [moved, 0]);
        assert.equal(errors.length, 1, errors.join("\n"));
      });
    }

    for (const kind of Object.keys(CLIENTS)) {
      test(`${kind}: 200 concurrent callers through a SCRIPT FLUSH every 200 ms and a replica failover: no error`, async () => {
        for (const m of await masters(plain)) await admin(m.port, "FUNCTION", "FLUSH");
        const client = await CLIENTS[kind](plain, "script", closers);
        const limiter = new Limiter(client, { onError: "closed", timeoutMs: 2000, logger: quiet() });
        const loadsBefore = await statSum(plain, "script|load");
        const limit = new Limit(1_000_000, 1_000_000);
        const errors = [];
        const sources = new Map();
        // Connections of their own for the flushes, opened before the callers start.
        const nodes = plain.nodes.map((n) => {
          const c = new Redis({ port: n.port, host: "127.0.0.1", enableReadyCheck: false });
          c.on("error", () => {});
          closers.push(() => c.disconnect());
          return c;
        });
        // The replica of the first master's slots (the first master itself after an earlier
        // failover) takes over midway.
        const pair = [0, plain.nodes.indexOf(plain.replicas[0])];
        let replica = null;
        for (const i of pair) if (String((await nodes[i].call("ROLE"))[0]) === "slave") replica = i;
        assert.notEqual(replica, null);
        let flushes = 0;
        const caller = async (i) => {
          for (let n = 0; flushes < 8; n++) {
            try {
              const d = await limiter.acquire(`herd:${i}:${n % 7}`, limit);
              sources.set(d.source, (sources.get(d.source) ?? 0) + 1);
            } catch (error) {
              errors.push(error);
            }
            await sleep(10);
          }
        };
        const callers = Array.from({ length: 200 }, (_, i) => caller(i));
        for (; flushes < 8; flushes++) {
          await sleep(200);
          for (const c of nodes) if (String((await c.call("ROLE"))[0]) === "master") await c.call("SCRIPT", "FLUSH");
          if (flushes === 2) await nodes[replica].call("CLUSTER", "FAILOVER");
        }
        await Promise.all(callers);
        assert.deepEqual(errors.map((e) => e.message), []);
        assert.ok((sources.get("lua") ?? 0) > 200, JSON.stringify([...sources]));
        assert.equal(await statSum(plain, "script|load"), loadsBefore);
        // Each EVAL follows one EVALSHA that met NOSCRIPT: one reload per caller caught, no herd.
        assert.ok((await statSum(plain, "eval")) <= (await statSum(plain, "evalsha", "failed_calls")));
        const end = Date.now() + 10_000;
        while (String((await nodes[replica].call("ROLE"))[0]) !== "master") {
          assert.ok(Date.now() < end, "the failover did not happen");
          await sleep(50);
        }
      });
    }
  });
}

// The module loaded on every node while limiters run on the script and the Functions library:
// once a module-path limiter converted the keys, the old limiters' next acquireAcrossSlots
// (one call per slot) goes to the module and answers exactly, with no error.
test("redis cluster: the module loaded later answers the keys it converted, through both cluster clients", { timeout: 60_000 }, async () => {
  const closers = [];
  const cluster = await Cluster.start({ masters: 3, args: ["--enable-module-command", "yes"] });
  try {
    const olds = [];
    const open = async (kind, path) => {
      const logs = [], infos = [];
      const limiter = new Limiter(await CLIENTS[kind](cluster, null, closers),
        { onError: "open", logger: { ...quiet(logs), info: (m) => infos.push(m) } });
      assert.equal(await limiter.check(), path, `${kind} ${path}`);
      olds.push({ kind, path, limiter, logs, infos });
    };
    for (const kind of Object.keys(CLIENTS)) await open(kind, "lua");
    const loader = await CLIENTS.ioredis(cluster, null, closers);
    await loadFunctions(loader);
    for (const kind of Object.keys(CLIENTS)) await open(kind, "functions");
    const limit = new Limit(0.001, 10);
    const itemsOf = (old) => ["a", "b", "c"].map((p) => [`${p}:${old.kind}:${old.path}`, limit]);
    assert.equal(new Set(itemsOf(olds[0]).map(([k]) => keySlot(k))).size, 3);
    for (const old of olds) {
      const d = await old.limiter.acquireAcrossSlots(itemsOf(old));
      assert.deepEqual([d.allowed, d.outcomes.map((o) => [o.decision.remaining, o.decision.source])],
        [true, Array(3).fill([9, old.path])]);
    }
    await cluster.everyNode("MODULE", "LOAD", MODULE);
    await sleep(2); // Redis 7.0's module clock is whole ms, the script's TIME µs
    const other = new Limiter(await CLIENTS.ioredis(cluster, null, closers), { onError: "closed", logger: quiet() });
    assert.equal(await other.check(), "module");
    for (const old of olds) {
      for (const [key] of itemsOf(old)) assert.equal((await other.acquire(key, limit)).remaining, 8, key);
    }
    for (const old of olds) {
      const what = `${old.kind} ${old.path}`;
      const d = await old.limiter.acquireAcrossSlots(itemsOf(old));
      assert.deepEqual([d.allowed, d.outcomes.map((o) => [o.status, o.decision.remaining, o.decision.source])],
        [true, Array(3).fill(["taken", 7, "redis"])], what);
      assert.equal(old.limiter.path, "module", what);
      assert.deepEqual(old.logs, [], what);
      assert.equal(old.infos.length, 1, what);
      assert.match(old.infos[0], /WRONGTYPE.*using the module path/, what);
      assert.deepEqual([old.limiter.counters.outages, old.limiter.counters.misconfigured], [0, 0], what);
    }
  } finally {
    for (const close of closers.reverse()) await close();
    await cluster.close();
  }
});
