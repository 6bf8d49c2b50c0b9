// The in-process bucket (the `local` policy) against clients/vectors/bucket.json, the vectors
// the module's bucket is held to. No server needed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { acquire, charge, refund, fromDecimal, fromRate, numberText, Q, LocalBuckets } from "../src/bucket.js";
import { Limit, RANGES } from "../src/index.js";

const MAX_DEBT_NS = new Q(BigInt(RANGES.refill.max_s) * 1_000_000_000n);
const vectors = JSON.parse(readFileSync(new URL("../../vectors/bucket.json", import.meta.url)));

test("every step of every vector case matches", () => {
  assert.equal(vectors.format, 1);
  let steps = 0;
  for (const c of vectors.cases) {
    // Exact decimals and N/S, as the module parses them.
    const rate = fromRate(c.rate);
    const capacity = fromDecimal(c.capacity);
    let state = null;
    c.steps.forEach((step, i) => {
      const cost = fromDecimal(step.cost);
      const now = BigInt(step.now_us);
      const out = step.op === "refund"
        ? refund(rate, capacity, state, now, cost)
        : step.op === "charge"
          ? charge(rate, capacity, state, now, cost, MAX_DEBT_NS)
          : acquire(rate, capacity, state, now, cost, step.op === "acquire");
      state = out.state;
      assert.deepEqual(out.reply, step.expect, `${c.name}, step ${i}: ${JSON.stringify(step)}`);
      steps++;
    });
  }
  assert.ok(steps > 100);
});

test("numbers are sent as their shortest decimal and mean its exact value", () => {
  assert.deepEqual(fromDecimal("0.1"), new Q(1n, 10n)); // not the double nearest it
  assert.deepEqual(fromDecimal("2.5E+3"), new Q(2500n));
  assert.deepEqual(fromDecimal("1e-7"), new Q(1n, 10_000_000n));
  assert.deepEqual(fromRate("100/60"), new Q(5n, 3n));
  assert.deepEqual(fromRate("2.5/0.5"), new Q(5n));
  assert.deepEqual(fromDecimal(".5"), new Q(1n, 2n));
  assert.deepEqual(fromDecimal("+5."), new Q(5n));
  for (const bad of ["", ".", "1e", "-1", "0x10", " 1", "1/2/3", "1/0"]) {
    assert.throws(() => fromRate(bad), RangeError, bad);
  }
  // JavaScript's String switches to e notation below 1e-6 and from 1e21: both are decimals.
  assert.equal(numberText(1e-7), "1e-7");
  assert.equal(numberText(1.5e21), "1.5e+21");
  assert.deepEqual(Q.of(1.5e21), new Q(1_500_000_000_000_000_000_000n));
  assert.deepEqual(Q.of(0.3), new Q(3n, 10n));
  assert.equal(new Q(-7n, 2n).floor(), -4n);
  assert.equal(new Q(7n, 2n).ceil(), 4n);
});

test("a limit per period is sent as N/S, with the count as its capacity", () => {
  const minute = new Limit(100, { per: 60 });
  assert.deepEqual(minute.args(), ["100/60", "100"]);
  assert.deepEqual(minute.rateQ, new Q(5n, 3n));
  assert.deepEqual(new Limit(100, 20, { per: 60 }).args(), ["100/60", "20"]);
  assert.deepEqual(new Limit({ rate: 3, capacity: 2, per: 10 }).args(), ["3/10", "2"]);
  assert.ok(new Limit(5, { per: 1 }).equals(new Limit(5, 5)));
  assert.ok(!new Limit(100, { per: 60 }).equals(new Limit(100 / 60, 100)));
  assert.deepEqual(new Limit(0.1, 1e-7).args(), ["0.1", "1e-7"]);
  assert.throws(() => new Limit(1, { per: 0 }), /per must be/);
  assert.throws(() => new Limit(1, { per: 1e7 }), RangeError); // 1e-7 per second: below the range
  assert.throws(() => new Limit(1), TypeError);
});

test("local buckets share a limit between instances and are bounded", () => {
  const local = new LocalBuckets(4, 3);
  const limit = new Limit(10, 8); // each instance: 2 tokens at 2.5/s
  assert.deepEqual(local.acquire("k", limit, 1, 1_000_000n), [1, 1, 0, 400]);
  assert.deepEqual(local.acquire("k", limit, 1, 1_000_000n), [1, 0, 0, 800]);
  assert.deepEqual(local.acquire("k", limit, 1, 1_000_000n), [0, 0, 400, 800]);
  for (let i = 0; i < 10; i++) local.acquire(`k${i}`, limit, 1, 0n);
  assert.equal(local.size, 3);
});

test("local acquireAll takes nothing when one bucket refuses", () => {
  const local = new LocalBuckets(1);
  const a = new Limit(1, 5), b = new Limit(1, 1);
  assert.deepEqual(local.acquireAll([["a", a, 1], ["b", b, 1]], 0n).slice(0, 3), [1, -1, 0]);
  const [allowed, refused, retry] = local.acquireAll([["a", a, 1], ["b", b, 1]], 0n);
  assert.deepEqual([allowed, refused, retry], [0, 1, 1000]);
  assert.equal(local.acquire("a", a, 0, 0n)[1], 4);
});

import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const LUA = ["lua5.1", "lua"].find((l) => spawnSync(l, ["-v"]).status === 0);
const luaDir = fileURLToPath(new URL("../../lua/", import.meta.url));

test("the Lua script, given this library's arguments, replies as the vectors say", { skip: !LUA && "no lua5.1" }, () => {
  const lines = [], expected = [], names = [];
  vectors.cases.forEach((c, n) => {
    const [count, per] = c.rate.split("/").map(Number);
    const limit = new Limit(count, Number(c.capacity), { per });
    c.steps.forEach((step, i) => {
      const args = limit.scriptArgs(Number(step.cost), step.op === "refund");
      lines.push([step.now_us, `case${n}`, step.op, ...args].join(" "));
      expected.push(step.expect);
      names.push(`${c.name}, step ${i}`);
    });
  });
  const out = spawnSync(LUA, [luaDir + "harness.lua", luaDir + "rl.lua"], { input: lines.join("\n") + "\n", encoding: "utf8" });
  assert.equal(out.status, 0, out.stderr);
  const replies = out.stdout.trim().split("\n");
  assert.equal(replies.length, expected.length);
  replies.forEach((r, i) => assert.deepEqual(r.split(" ").map(Number), expected[i], names[i]));
});

test("the package ships the shared Lua script", () => {
  assert.equal(readFileSync(new URL("../src/rl.lua", import.meta.url), "utf8"), readFileSync(luaDir + "rl.lua", "utf8"));
});
