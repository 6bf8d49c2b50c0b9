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
import { BINARIES, admin, calls, withCleanups } from "./servers.js";
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
