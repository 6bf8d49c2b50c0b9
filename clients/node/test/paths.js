// Helpers for the path tests (paths.test.js, misconfigured.test.js, paths-cluster.test.js):
// least-privilege users from clients/vectors/permissions.json, the clients as such a user, the
// calls every path must answer exactly alike, and the check that no privileged probe was sent.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import Redis from "ioredis";
import Redis6 from "ioredis6";
import { createClient } from "redis";
import { createClient as createClient4 } from "redis4";
import { createClient as createClient6 } from "redis6";
import { Limit } from "../src/index.js";
import { admin } from "./servers.js";

const PERMISSIONS = JSON.parse(readFileSync(new URL("../../vectors/permissions.json", import.meta.url), "utf8"));
export const SCRIPT = readFileSync(new URL("../src/rl.lua", import.meta.url), "utf8");
export const SOURCES = { module: "redis", functions: "functions", lua: "lua" };

/** The rules of permissions.json for a user of `path` ("module", "functions", "script",
 * "script_preloaded"), `kind` "decide" (with "tables") or "peek". */
export function rulesOf(path, { kind = "decide", cluster = false } = {}) {
  const p = PERMISSIONS.paths[path];
  return [...PERMISSIONS.connection, ...(cluster ? PERMISSIONS.cluster : []), ...p[kind], ...(kind === "decide" ? p.tables : [])];
}

/** ACL SETUSER `name` on `ports` with `rules`, as the docs write it. */
export async function createUser(ports, name, rules) {
  for (const port of ports) await admin(port, "ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "resetchannels", "-@all", ...rules);
}

/** The clients, as a user `user` (or the default user): [name, connect(port, user, scope)]. */
export const CLIENTS = {
  "ioredis 5": (port, user, scope) => ioredis(Redis, port, user, scope),
  "ioredis 6": (port, user, scope) => ioredis(Redis6, port, user, scope),
  "node-redis 4": (port, user, scope) => nodeRedis(createClient4, port, user, scope),
  "node-redis 5": (port, user, scope) => nodeRedis(createClient, port, user, scope),
  "node-redis 6": (port, user, scope) => nodeRedis(createClient6, port, user, scope),
};

async function ioredis(Client, port, user, scope) {
  // No ready check: it sends INFO, which a least-privilege user may not run (ioredis then
  // skips it with a warning).
  const c = new Client({ port, host: "127.0.0.1", enableReadyCheck: false, ...(user ? { username: user, password: "pw" } : {}) });
  c.on("error", () => {});
  scope.defer(() => c.disconnect());
  return c;
}

async function nodeRedis(create, port, user, scope) {
  const c = create({ socket: { port, host: "127.0.0.1" }, ...(user ? { username: user, password: "pw" } : {}) });
  c.on("error", () => {});
  await c.connect();
  scope.defer(() => (typeof c.destroy === "function" ? c.destroy() : c.isOpen && c.disconnect()));
  return c;
}

export const quiet = (logs = []) => ({ warn: (m) => logs.push(m), error: (m) => logs.push(m) });

/**
 * The same calls on every path, and what they must give: takes, a denial, a peek, a refund, a
 * charge into debt, all or nothing, a table's field. `path` is the one it must be on.
 */
export async function exactCounts(limiter, path) {
  const source = SOURCES[path];
  const limit = new Limit(0.001, 3);
  const key = `k:${randomUUID()}`;
  const takes = [];
  for (let i = 0; i < 4; i++) takes.push(await limiter.acquire(key, limit));
  assert.deepEqual(takes.map((d) => [d.allowed, d.remaining, d.source]),
    [[true, 2, source], [true, 1, source], [true, 0, source], [false, 0, source]]);
  const peek = await limiter.peek(key, limit);
  assert.deepEqual([peek.allowed, peek.remaining, peek.source], [false, 0, source]);
  const refund = await limiter.refund(key, limit, 2);
  assert.deepEqual([refund.remaining, refund.source], [2, source]);
  const charge = await limiter.charge(key, limit, 4);
  assert.deepEqual([charge.applied, charge.remaining, charge.source], [true, -2, source]);
  const tag = `{${randomUUID()}}`;
  const items = [[`${tag}:a`, new Limit(0.001, 2)], [`${tag}:b`, new Limit(0.001, 1)]];
  assert.deepEqual([(await limiter.acquireAll(items)).allowed, (await limiter.acquireAll(items)).refusedIndex], [true, 1]);
  const field = await limiter.table(`t${randomUUID()}`, 2).acquire("f", limit, 2);
  assert.deepEqual([field.allowed, field.remaining, field.source], [true, 1, source]);
  assert.equal(limiter.path, path);
  assert.equal(limiter.counters[source], 10);
  assert.deepEqual([limiter.counters.outages, limiter.counters.misconfigured], [0, 0]);
}

/**
 * That the server saw none of the privileged commands detection must not use: no COMMAND,
 * SCRIPT LOAD or MODULE at all, and no INFO refused (the tests' own INFO, as the default user,
 * are answered; one from a least-privilege user would be refused).
 */
export async function sentNoProbe(port, { adminScriptLoads = 0 } = {}) {
  const stats = String(await admin(port, "INFO", "commandstats")).split("\r\n");
  const count = (command, field) => {
    const line = stats.find((l) => l.startsWith(`cmdstat_${command}:`));
    return line ? Number(new RegExp(`${field}=(\\d+)`).exec(line)?.[1] ?? 0) : 0;
  };
  for (const command of ["command", "command|info", "command|docs", "script|load", "module|list"]) {
    const expected = command === "script|load" ? adminScriptLoads : 0;
    assert.equal(count(command, "calls") + count(command, "rejected_calls"), expected, command);
  }
  assert.equal(count("info", "rejected_calls"), 0, "info");
}

