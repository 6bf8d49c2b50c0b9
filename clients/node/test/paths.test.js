// The three paths on one server, found without privileges, on Redis and on Valkey 9 (when
// target/servers has it), through ioredis and node-redis: the module, the Functions library
// (loaded with loadFunctions) and the script, each as (a) the admin user, (b) a user with
// exactly the rules clients/vectors/permissions.json lists for that path, (c) on a server
// whose COMMAND is renamed away, (d) as a user refused SCRIPT LOAD (the script loaded by an
// admin), (e) as a user allowed FCALL only. Each gives the exact decisions, says its path,
// and sends none of COMMAND, INFO or SCRIPT LOAD (INFO commandstats of the server).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import Redis from "ioredis";
import { FUNCTIONS_VERSION, Limit, Limiter, loadFunctions } from "../src/index.js";
import { BINARIES, MODULE, admin, calls, withCleanups } from "./servers.js";
import { CLIENTS, SCRIPT, SOURCES, createUser, exactCounts, quiet, rulesOf, sentNoProbe } from "./paths.js";

/** A server of `binary` with the module (path "module") or without, the library loaded
 * (path "functions") or not ("lua"). */
async function serverFor(scope, binary, path, args = []) {
  const s = await scope.server(path === "module", { binary, args });
  if (path === "functions") {
    const c = new Redis({ port: s.port, host: "127.0.0.1" });
    scope.defer(() => c.disconnect());
    assert.equal(await loadFunctions(c), FUNCTIONS_VERSION);
  }
  return s;
}

const PATH_RULES = { module: "module", functions: "functions", lua: "script" };

for (const [server, binary] of BINARIES) {
  for (const kind of ["ioredis 5", "node-redis 5"]) {
    for (const path of ["module", "functions", "lua"]) {
      test(`${server}, ${kind}, ${path}: (a) admin, (b) least privilege, (c) COMMAND renamed away: exact counts`, () => withCleanups(async (scope) => {
        for (const [what, args, user] of [["admin", [], null], ["least privilege", [], "app"],
          ["no COMMAND", ["--rename-command", "COMMAND", ""], "app"]]) {
          const s = await serverFor(scope, binary, path, args);
          if (user) await createUser([s.port], user, rulesOf(PATH_RULES[path]));
          const logs = [];
          const limiter = new Limiter(await CLIENTS[kind](s.port, user, scope), { onError: "closed", logger: quiet(logs) });
          assert.equal(await limiter.check(), path, what);
          await exactCounts(limiter, path);
          await sentNoProbe(s.port);
          assert.deepEqual(logs, [], what);
        }
      }));
    }

    test(`${server}, ${kind}: (d) a user refused SCRIPT LOAD runs the script an admin loaded, and EVAL after a flush`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary });
      await createUser([s.port], "app", ["+@all", "-script|load"]);
      await admin(s.port, "SCRIPT", "LOAD", SCRIPT);
      const limiter = new Limiter(await CLIENTS[kind](s.port, "app", scope), { onError: "closed", logger: quiet() });
      assert.equal(await limiter.check(), "lua");
      await exactCounts(limiter, "lua");
      const stats = { send: (args) => admin(s.port, ...args) };
      assert.equal(await calls(stats, "eval"), 0); // loaded by the admin: EVALSHA alone
      await admin(s.port, "SCRIPT", "FLUSH");
      assert.equal((await limiter.acquire(`f:${randomUUID()}`, new Limit(1, 1))).source, "lua");
      assert.equal(await calls(stats, "eval"), 1);
      await sentNoProbe(s.port, { adminScriptLoads: 1 });
    }));

    test(`${server}, ${kind}: (d') a user allowed EVALSHA only runs the script an admin loaded (script_preloaded)`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { binary });
      await createUser([s.port], "app", rulesOf("script_preloaded"));
      await admin(s.port, "SCRIPT", "LOAD", SCRIPT);
      const limiter = new Limiter(await CLIENTS[kind](s.port, "app", scope), { onError: "closed", logger: quiet() });
      assert.equal(await limiter.check(), "lua");
      await exactCounts(limiter, "lua");
      await sentNoProbe(s.port, { adminScriptLoads: 1 });
    }));

    test(`${server}, ${kind}: (e) a user allowed FCALL only (no EVAL, no EVALSHA) takes the Functions path`, () => withCleanups(async (scope) => {
      const s = await serverFor(scope, binary, "functions");
      await createUser([s.port], "app", rulesOf("functions"));
      const limiter = new Limiter(await CLIENTS[kind](s.port, "app", scope), { onError: "closed", logger: quiet() });
      assert.equal(await limiter.check(), "functions");
      await exactCounts(limiter, "functions");
      const stats = { send: (args) => admin(s.port, ...args) };
      assert.equal((await calls(stats, "evalsha")) + (await calls(stats, "eval")), 0);
    }));

    test(`${server}, ${kind}: a peek-only user peeks on the Functions path (FCALL_RO) and the script path`, () => withCleanups(async (scope) => {
      for (const [path, rules] of [["functions", "functions"], ["lua", "script"]]) {
        const s = await serverFor(scope, binary, path);
        await createUser([s.port], "reader", rulesOf(rules, { kind: "peek" }));
        const limiter = new Limiter(await CLIENTS[kind](s.port, "reader", scope), { onError: "closed", logger: quiet() });
        assert.equal(await limiter.check(), path);
        const d = await limiter.peek(`p:${randomUUID()}`, new Limit(1, 4), 1);
        assert.deepEqual([d.allowed, d.remaining, d.source], [true, 4, SOURCES[path]]);
      }
    }));
  }

  test(`${server}: a least-privilege user connects through every client major (their handshakes need only +@connection)`, () => withCleanups(async (scope) => {
    const s = await serverFor(scope, binary, "functions");
    await createUser([s.port], "app", rulesOf("functions"));
    for (const kind of Object.keys(CLIENTS)) {
      const limiter = new Limiter(await CLIENTS[kind](s.port, "app", scope), { onError: "closed", logger: quiet() });
      assert.equal(await limiter.check(), "functions", kind);
      await exactCounts(limiter, "functions");
    }
  }));

  test(`${server}: an older library (no rl_version, or a lower one) is logged at error level and the script is used`, () => withCleanups(async (scope) => {
    const s = await scope.server(false, { binary });
    const library = readFileSync(new URL("../src/rl_functions.lua", import.meta.url), "utf8");
    const c = new Redis({ port: s.port, host: "127.0.0.1" });
    scope.defer(() => c.disconnect());
    for (const [what, text, said] of [
      ["no rl_version", library.replace(/redis\.register_function\{function_name = 'rl_version'[^\n]*\n(\s*flags[^\n]*\n)?/, ""), /has no rl_version/],
      ["version 0", library.replace(/^local VERSION = \d+$/m, "local VERSION = 0"), /answers version 0/],
    ]) {
      assert.notEqual(text, library, what);
      await c.call("FUNCTION", "LOAD", "REPLACE", text);
      const errors = [];
      const limiter = new Limiter(c, { onError: "closed", logger: { warn() {}, error: (m) => errors.push(m) } });
      assert.equal(await limiter.check(), "lua", what);
      assert.equal(errors.length, 1, what);
      assert.match(errors[0], said);
      assert.match(errors[0], new RegExp(`needs version ${FUNCTIONS_VERSION}.*loadFunctions`));
    }
  }));
}

test("the path changes when the library is loaded or deleted, with no error raised", () => withCleanups(async (scope) => {
  const s = await scope.server(false);
  const c = new Redis({ port: s.port, host: "127.0.0.1" });
  scope.defer(() => c.disconnect());
  const limiter = new Limiter(c, { onError: "closed", logger: quiet() });
  const limit = new Limit(0.001, 10);
  assert.equal((await limiter.acquire("moving", limit)).source, "lua");
  await loadFunctions(c);
  // The script still answers; the limiter keeps its path until it stops answering.
  assert.equal((await limiter.acquire("moving", limit)).source, "lua");
  assert.equal(await limiter.check(), "functions");
  assert.deepEqual([(await limiter.acquire("moving", limit)).source, (await limiter.peek("moving", limit)).remaining],
    ["functions", 7]);
  await c.call("FUNCTION", "DELETE", "redis_rl");
  const after = await limiter.acquire("moving", limit);
  assert.deepEqual([after.source, after.remaining], ["lua", 6]);
}));

// The module loaded while a limiter runs on the Functions library or the script: module-path
// processes convert the buckets to the module's type, which the fallback answers WRONGTYPE for.
// The old limiter sends that call to the module once and, as it answers, keeps the module path
// (logged at info); a string key still gets WRONGTYPE, and so does a user who may not run RL.*.
for (const kind of ["ioredis 5", "node-redis 5"]) {
  for (const path of ["functions", "lua"]) {
    test(`${kind}, ${path}: the module loaded later answers the keys it converted, with no error`, () => withCleanups(async (scope) => {
      const s = await scope.server(false, { args: ["--enable-module-command", "yes"] });
      if (path === "functions") {
        const c = new Redis({ port: s.port, host: "127.0.0.1" });
        scope.defer(() => c.disconnect());
        await loadFunctions(c);
      }
      await createUser([s.port], "app", rulesOf(PATH_RULES[path]));
      const source = SOURCES[path];
      const limit = new Limit(0.001, 10);
      const tag = `{${randomUUID()}}`;
      const keys = { acquire: `${tag}:a`, peek: `${tag}:p`, acquireAll: `${tag}:m`, refused: `${tag}:r` };
      const olds = {};
      for (const name of [...Object.keys(keys), "string"]) {
        const logs = [], infos = [];
        const user = name === "refused" ? "app" : null; // may run the fallback, not RL.*
        const limiter = new Limiter(await CLIENTS[kind](s.port, user, scope),
          { onError: "open", logger: { ...quiet(logs), info: (m) => infos.push(m) } });
        assert.equal(await limiter.check(), path, name);
        olds[name] = { limiter, logs, infos };
      }
      for (const [name, key] of Object.entries(keys)) {
        const d = await olds[name].limiter.acquire(key, limit);
        assert.deepEqual([d.allowed, d.remaining, d.source], [true, 9, source], name);
      }
      // A string key, module missing: the fallback's WRONGTYPE, and the path stays.
      await admin(s.port, "SET", `${tag}:s`, "x");
      const old = olds.string.limiter;
      await assert.rejects(old.acquire(`${tag}:s`, limit), /WRONGTYPE/);
      assert.equal(old.path, path);
      assert.equal((await old.acquire(`${tag}:x`, limit)).source, source);

      await admin(s.port, "MODULE", "LOAD", MODULE);
      // Redis 7.0's module clock is whole ms, the script's TIME µs: let the module's read come
      // after the script's write.
      await new Promise((resolve) => setTimeout(resolve, 2));
      const other = new Limiter(await CLIENTS[kind](s.port, null, scope), { onError: "closed", logger: quiet() });
      assert.equal(await other.check(), "module");
      for (const [name, key] of Object.entries(keys)) {
        const d = await other.acquire(key, limit);
        assert.deepEqual([d.allowed, d.remaining, d.source], [true, 8, "redis"], name);
      }

      const taken = await olds.acquire.limiter.acquire(keys.acquire, limit);
      assert.deepEqual([taken.allowed, taken.remaining, taken.source], [true, 7, "redis"]);
      const peeked = await olds.peek.limiter.peek(keys.peek, limit);
      assert.deepEqual([peeked.allowed, peeked.remaining, peeked.source], [true, 8, "redis"]);
      const all = await olds.acquireAll.limiter.acquireAll([[keys.acquireAll, limit, 2]]);
      assert.deepEqual([all.allowed, all.source, all.decisions.map((d) => d.remaining)], [true, "redis", [6]]);
      for (const name of ["acquire", "peek", "acquireAll"]) {
        const { limiter, logs, infos } = olds[name];
        assert.equal(limiter.path, "module", name);
        assert.deepEqual(logs, [], name);
        assert.equal(infos.length, 1, name);
        assert.match(infos[0], new RegExp(`the ${path === "lua" ? "script" : "Functions library"} met a key of another type \\(WRONGTYPE\\).*using the module path`));
        assert.deepEqual([limiter.counters.outages, limiter.counters.misconfigured], [0, 0], name);
      }
      // Once on the module, the next call goes there straight.
      const again = await olds.acquire.limiter.acquire(keys.acquire, limit);
      assert.deepEqual([again.remaining, again.source], [6, "redis"]);

      // A user who may not run RL.*: the fallback's own WRONGTYPE, raised, not decided by the
      // policy, and the path stays.
      const refused = olds.refused;
      await assert.rejects(refused.limiter.acquire(keys.refused, limit),
        (e) => /WRONGTYPE/.test(e.message) && /@user_(script|function)/.test(e.message));
      assert.equal(refused.limiter.path, path);
      assert.deepEqual([refused.infos, refused.limiter.counters.outages, refused.limiter.counters.open], [[], 0, 0]);

      // A string key still gets WRONGTYPE: the module's own, after which the limiter is on the module.
      await assert.rejects(old.acquire(`${tag}:s`, limit), /WRONGTYPE/);
      assert.equal(old.path, "module");
      assert.equal(await admin(s.port, "GET", `${tag}:s`), "x");
      assert.deepEqual([old.counters.outages, old.counters.misconfigured], [0, 0]);
    }));
  }
}
