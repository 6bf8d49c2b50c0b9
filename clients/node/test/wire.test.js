// clients/vectors/wire.json: for each limit a user can build, the exact `rate capacity cost`
// that must reach the module. Each case's Limit is built as a user would (JSON strings as
// strings, numbers as numbers, per as the { per } option, capacity null left out), acquired
// on real servers through each client the library supports (ioredis 5 and 6, node-redis 4, 5
// and 6), and
// MONITOR shows what arrived: on the module path RL.ACQUIRE / RL.HACQUIRE carry the texts, on
// the Lua path (a server without the module) EVALSHA carries the script's 10 numbers (packed
// in one argument of doubles), and on the Functions path (the library loaded) FCALL
// rl_acquire_packed the same 10 numbers, which
// are computed here from the same texts with exact rational arithmetic (clients/lua/rl.lua's
// header). Cases other clients cannot build (`python_only`) are skipped; fields a case may
// carry that this test does not read are ignored.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import Redis from "ioredis";
import Redis6 from "ioredis6";
import { createClient } from "redis";
import { createClient as createClient4 } from "redis4";
import { createClient as createClient6 } from "redis6";
import { Limit, Limiter, loadFunctions } from "../src/index.js";
import { withCleanups } from "./servers.js";

const WIRE = JSON.parse(readFileSync(new URL("../../vectors/wire.json", import.meta.url), "utf8"));
const CASES = WIRE.cases.filter((c) => !c.python_only);

/** The Limit a user writes for a case. */
function limitOf({ rate, per, capacity }) {
  const options = per === null || per === undefined ? undefined : { per };
  if (capacity === null || capacity === undefined) return new Limit(rate, options);
  return options ? new Limit(rate, capacity, options) : new Limit(rate, capacity);
}

/** An exact fraction [numerator, denominator] (BigInt, reduced, d > 0). */
const gcd = (a, b) => { a = a < 0n ? -a : a; while (b) [a, b] = [b, a % b]; return a; };
const frac = (n, d) => { const g = gcd(n, d) || 1n; return [n / g, d / g]; };
/** The exact value of a module argument's text: a decimal ("0.1", "1e-7") or N/S ("100/60"). */
function exact(text) {
  if (text.includes("/")) {
    const [[a, b], [c, d]] = text.split("/").map(exact);
    return frac(a * d, b * c);
  }
  const m = /^(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$/i.exec(text);
  assert.ok(m, `not a decimal: ${text}`);
  const digits = BigInt((m[1] || "0") + (m[2] ?? "")), exp = Number(m[3] ?? 0) - (m[2] ?? "").length;
  return exp >= 0 ? frac(digits * 10n ** BigInt(exp), 1n) : frac(digits, 10n ** BigInt(-exp));
}
const floorDiv = (n, d) => (n >= 0n ? n / d : -((-n + d - 1n) / d));
const ceilDiv = (n, d) => -floorDiv(-n, d);

/** The script's 10 numbers for an acquire of the exact `rate capacity cost` texts: D, then T,
 * C, S, K as pairs q + r/D µs, then floor(capacity), when T = 1e6 / rate has a denominator
 * below 2^31 (every case here). */
function scriptArgs([rateText, capacityText, costText]) {
  const [rn, rd] = exact(rateText), [cn, cd] = exact(capacityText), [kn, kd] = exact(costText);
  const [tn, d] = frac(1_000_000n * rd, rn); // T = 1e6 / rate µs, over its own denominator D
  assert.ok(d < 2n ** 31n, `${rateText}: not exact in the script`);
  // x * T in units of 1/D µs is x * tn: a pair (q, r) with q = units div D, r = units mod D.
  const pair = (units) => [floorDiv(units, d), units - floorDiv(units, d) * d];
  const t = pair(tn);
  const c = pair(floorDiv(cn * tn, cd));
  const s = pair(floorDiv((cn * kd - kn * cd) * tn, cd * kd));
  const k = pair(ceilDiv(kn * tn, kd));
  return [d, ...t, ...c, ...s, ...k, floorDiv(cn, cd)].map(String);
}

/** scriptArgs as the one argument the library sends (ten little-endian doubles), as the
 * monitor event gives it: MONITOR writes a byte as Redis's sdscatrepr does (printable ASCII
 * as itself, a quote and a backslash escaped, \\n \\r \\t \\a \\b, anything else \\xNN), and
 * ioredis undoes the quote's escape only. */
function packedShown(numbers) {
  const bytes = Buffer.alloc(80);
  numbers.forEach((n, i) => bytes.writeDoubleLE(Number(n), i * 8));
  const named = { 10: "\\n", 13: "\\r", 9: "\\t", 7: "\\a", 8: "\\b", 92: "\\\\", 34: '"' };
  let out = "";
  for (const b of bytes) {
    if (named[b] !== undefined) out += named[b];
    else if (b >= 32 && b < 127) out += String.fromCharCode(b);
    else out += "\\x" + b.toString(16).padStart(2, "0");
  }
  return [out];
}

const ioredis = (Client) => async (port, scope) => {
  const c = new Client({ port, host: "127.0.0.1" });
  scope.defer(() => c.disconnect());
  return c;
};
const CLIENTS = {
  "ioredis 5": ioredis(Redis),
  "ioredis 6": ioredis(Redis6),
  "node-redis 6": (port, scope) => nodeRedis(createClient6, port, scope),
  "node-redis 5": (port, scope) => nodeRedis(createClient, port, scope),
  "node-redis 4": (port, scope) => nodeRedis(createClient4, port, scope),
};

async function nodeRedis(create, port, scope) {
  const c = create({ socket: { port, host: "127.0.0.1" } });
  c.on("error", () => {});
  await c.connect();
  scope.defer(() => c.disconnect());
  return c;
}

/** Runs `calls(limiter)` with MONITOR on `port` and gives the commands the server saw. */
async function monitored(scope, port, client, calls) {
  const watcher = new Redis({ port, host: "127.0.0.1", lazyConnect: true });
  const monitor = await watcher.monitor();
  scope.defer(() => { monitor.disconnect(); watcher.disconnect(); });
  const seen = [];
  monitor.on("monitor", (time, args) => seen.push(args));
  const limiter = new Limiter(client, { onError: "closed", logger: { warn() {} } });
  await calls(limiter);
  const marker = new Redis({ port, host: "127.0.0.1" });
  scope.defer(() => marker.disconnect());
  await marker.ping("end"); // MONITOR shows it after every call above
  const end = Date.now() + 10_000;
  while (!seen.some((a) => a[0] === "ping")) {
    assert.ok(Date.now() < end, "MONITOR never showed the last command");
    await new Promise((r) => setTimeout(r, 10));
  }
  return seen;
}

test("scriptArgs here agrees with rl.lua's header on a case worked by hand", () => {
  // 3/10 per s: T = 10^7/3 µs (D = 3, q = 3333333, r = 1); capacity 7: C = 7 x T = 70000000/3;
  // cost 2: S = 5 x T = 50000000/3, K = 2 x T = 20000000/3.
  assert.deepEqual(scriptArgs(["3/10", "7", "2"]),
    ["3", "3333333", "1", "23333333", "1", "16666666", "2", "6666666", "2", "7"]);
  assert.deepEqual(scriptArgs(["2.5", "5", "0.5"]), ["1", "400000", "0", "2000000", "0", "1800000", "0", "200000", "0", "5"]);
});

for (const [kind, connect] of Object.entries(CLIENTS)) {
  test(`wire.json (${kind}): the module gets each case's exact args, per key and in a table`, () => withCleanups(async (scope) => {
    assert.equal(WIRE.format, 1);
    assert.ok(CASES.length >= 9, "wire.json lost its cases");
    const s = await scope.server(true);
    const seen = await monitored(scope, s.port, await connect(s.port, scope), async (limiter) => {
      const table = limiter.table("wire");
      for (const [i, c] of CASES.entries()) {
        const limit = limitOf(c);
        const d = await limiter.acquire(`wire:${i}`, limit, c.cost);
        const t = await table.acquire(`f${i}`, limit, c.cost);
        assert.deepEqual([d.source, t.source], ["redis", "redis"], c.name);
      }
    });
    const acquires = seen.filter((a) => /^RL\.H?ACQUIRE$/i.test(a[0]));
    assert.equal(acquires.length, 2 * CASES.length);
    CASES.forEach((c, i) => {
      assert.deepEqual(acquires[2 * i], ["RL.ACQUIRE", `wire:${i}`, ...c.args], c.name);
      const [name, , field, ...args] = acquires[2 * i + 1];
      assert.deepEqual([name, field, args], ["RL.HACQUIRE", `f${i}`, c.args], `${c.name} (table)`);
    });
  }));

  test(`wire.json (${kind}): the Lua script gets each case's exact values, per key and in a table`, () => withCleanups(async (scope) => {
    const s = await scope.server(false);
    const seen = await monitored(scope, s.port, await connect(s.port, scope), async (limiter) => {
      const table = limiter.table("wire");
      for (const [i, c] of CASES.entries()) {
        const limit = limitOf(c);
        const d = await limiter.acquire(`wire:${i}`, limit, c.cost);
        const t = await table.acquire(`f${i}`, limit, c.cost);
        assert.deepEqual([d.source, t.source], ["lua", "lua"], c.name);
      }
    });
    // The first call finds no script (NOSCRIPT) and goes again as EVAL, which caches it.
    const calls = seen.filter((a) => /^EVALSHA$/i.test(a[0]));
    const answered = [];
    for (const a of calls) if (!answered.length || answered.at(-1).join() !== a.join()) answered.push(a);
    assert.equal(answered.length, 2 * CASES.length);
    CASES.forEach((c, i) => {
      const want = packedShown(scriptArgs(c.args));
      // sha, 1 key, the key, then the packed numbers: the script's short form, no mode.
      assert.deepEqual(answered[2 * i].slice(2), ["1", `wire:${i}`, ...want], c.name);
      const [numKeys, key, ...numbers] = answered[2 * i + 1].slice(2);
      assert.ok(key.startsWith("wire:") && key.endsWith(`:f${i}`), `${c.name} (table): key ${key}`);
      assert.deepEqual([numKeys, numbers], ["1", want], `${c.name} (table)`);
    });
  }));
}

test("the Lua script: only a one-key acquire leaves out the mode", () => withCleanups(async (scope) => {
  const s = await scope.server(false);
  const c = CASES[0];
  const want = packedShown(scriptArgs(c.args));
  const seen = await monitored(scope, s.port, await CLIENTS["ioredis 5"](s.port, scope), async (limiter) => {
    const limit = limitOf(c);
    assert.equal((await limiter.acquire("short", limit, c.cost)).allowed, true);
    await limiter.peek("short", limit, c.cost);
    await limiter.acquireAll([["short", limit, c.cost]]);
    await limiter.refund("short", limit, c.cost);
  });
  const calls = seen.filter((a) => /^EVALSHA$/i.test(a[0]));
  const answered = [];
  for (const a of calls) if (!answered.length || answered.at(-1).join() !== a.join()) answered.push(a);
  assert.equal(answered.length, 4);
  assert.deepEqual(answered[0].slice(2), ["1", "short", ...want]);
  assert.deepEqual(answered[1].slice(2), ["1", "short", "peek", ...want]);
  assert.deepEqual(answered[2].slice(2), ["1", "short", "multi", ...want]);
  assert.deepEqual(answered[3].slice(2, 5), ["1", "short", "refund"]);
}));

for (const [kind, connect] of Object.entries(CLIENTS)) {
  test(`wire.json (${kind}): the Functions library gets each case's exact values, per key and in a table`, () => withCleanups(async (scope) => {
    const s = await scope.server(false);
    const client = await connect(s.port, scope);
    const loader = new Redis({ port: s.port, host: "127.0.0.1" });
    scope.defer(() => loader.disconnect());
    await loadFunctions(loader);
    const seen = await monitored(scope, s.port, client, async (limiter) => {
      const table = limiter.table("wire");
      for (const [i, c] of CASES.entries()) {
        const limit = limitOf(c);
        const d = await limiter.acquire(`wire:${i}`, limit, c.cost);
        const t = await table.acquire(`f${i}`, limit, c.cost);
        assert.deepEqual([d.source, t.source], ["functions", "functions"], c.name);
      }
    });
    const calls = seen.filter((a) => /^FCALL$/i.test(a[0]));
    assert.equal(calls.length, 2 * CASES.length);
    CASES.forEach((c, i) => {
      const want = packedShown(scriptArgs(c.args));
      // The function, 1 key, the key, then the numbers (no mode).
      assert.deepEqual(calls[2 * i].slice(1), ["rl_acquire_packed", "1", `wire:${i}`, ...want], c.name);
      const [name, numKeys, key, ...numbers] = calls[2 * i + 1].slice(1);
      assert.ok(key.startsWith("wire:") && key.endsWith(`:f${i}`), `${c.name} (table): key ${key}`);
      assert.deepEqual([name, numKeys, numbers], ["rl_acquire_packed", "1", want], `${c.name} (table)`);
    });
  }));
}

test("per is a number or its text, like rate and capacity; anything else is refused", () => {
  assert.deepEqual(new Limit("5", { per: "60" }).args(), new Limit(5, { per: 60 }).args());
  assert.deepEqual(new Limit(1, { per: "0.5" }).args(), ["1/0.5", "1"]);
  for (const per of ["", " ", "abc", "0", "-1", "Infinity", null, true, 0, -2, NaN]) {
    assert.throws(() => new Limit(1, { per }), /per must be a finite number of seconds above 0/, String(per));
  }
});
