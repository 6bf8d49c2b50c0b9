// clients/vectors/wire.json: for each limit a user can build, the exact `rate capacity cost`
// that must reach the module. Each case's Limit is built as a user would (JSON strings as
// strings, numbers as numbers, per as the { per } option, capacity null left out), acquired
// on a real server with the module, per key and in a bucket table, and MONITOR shows what
// arrived.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import Redis from "ioredis";
import { Limit, Limiter } from "../src/index.js";
import { withCleanups } from "./servers.js";

const WIRE = JSON.parse(readFileSync(new URL("../../vectors/wire.json", import.meta.url), "utf8"));
// A python_only case is built from Python types (a timedelta, a rate as "N/S" text).
const CASES = WIRE.cases.filter((c) => !c.python_only);

/** The Limit a user writes for a case. */
function limitOf({ rate, per, capacity }) {
  const options = per === null ? undefined : { per };
  if (capacity === null) return new Limit(rate, options);
  return options ? new Limit(rate, capacity, options) : new Limit(rate, capacity);
}

test("wire.json: every case's limit builds and sends exactly its args, per key and in a table", () => withCleanups(async (scope) => {
  assert.equal(WIRE.format, 1);
  const s = await scope.server();
  const redis = new Redis({ port: s.port, host: "127.0.0.1" });
  scope.defer(() => redis.disconnect());
  const watcher = new Redis({ port: s.port, host: "127.0.0.1", lazyConnect: true });
  const monitor = await watcher.monitor();
  scope.defer(() => { monitor.disconnect(); watcher.disconnect(); });
  const seen = [];
  monitor.on("monitor", (time, args) => seen.push(args));
  const limiter = new Limiter(redis, { onError: "closed", logger: { warn() {} } });
  const table = limiter.table("wire");
  for (const [i, c] of CASES.entries()) {
    const limit = limitOf(c);
    const d = await limiter.acquire(`wire:${i}`, limit, c.cost);
    const t = await table.acquire(`f${i}`, limit, c.cost);
    assert.deepEqual([d.source, t.source], ["redis", "redis"], c.name);
  }
  await redis.ping("end"); // MONITOR shows it after every call above
  const end = Date.now() + 10_000;
  while (!seen.some((a) => a[0] === "ping")) {
    assert.ok(Date.now() < end, "MONITOR never showed the last command");
    await new Promise((r) => setTimeout(r, 10));
  }
  const acquires = seen.filter((a) => /^RL\.H?ACQUIRE$/i.test(a[0]));
  assert.equal(acquires.length, 2 * CASES.length);
  CASES.forEach((c, i) => {
    assert.deepEqual(acquires[2 * i], ["RL.ACQUIRE", `wire:${i}`, ...c.args], c.name);
    const [name, , field, ...args] = acquires[2 * i + 1];
    assert.deepEqual([name, field, args], ["RL.HACQUIRE", `f${i}`, c.args], `${c.name} (table)`);
  });
}));

test("per is a number or its text, like rate and capacity; anything else is refused", () => {
  assert.deepEqual(new Limit("5", { per: "60" }).args(), new Limit(5, { per: 60 }).args());
  assert.deepEqual(new Limit(1, { per: "0.5" }).args(), ["1/0.5", "1"]);
  for (const per of ["", " ", "abc", "0", "-1", "Infinity", null, true, 0, -2, NaN]) {
    assert.throws(() => new Limit(1, { per }), /per must be a finite number of seconds above 0/, String(per));
  }
});
