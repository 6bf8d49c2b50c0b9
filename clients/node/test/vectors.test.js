// The in-process bucket (the `local` policy) against clients/vectors/bucket.json, the vectors
// the module's bucket is held to. No server needed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { acquire, refund, fromDouble, Q, LocalBuckets } from "../src/bucket.js";
import { Limit } from "../src/index.js";

const vectors = JSON.parse(readFileSync(new URL("../../vectors/bucket.json", import.meta.url)));

test("every step of every vector case matches", () => {
  assert.equal(vectors.format, 1);
  let steps = 0;
  for (const c of vectors.cases) {
    const rate = fromDouble(Number(c.rate));
    const capacity = fromDouble(Number(c.capacity));
    let state = null;
    c.steps.forEach((step, i) => {
      const cost = fromDouble(Number(step.cost));
      const now = BigInt(step.now_us);
      const out = step.op === "refund"
        ? refund(rate, capacity, state, now, cost)
        : acquire(rate, capacity, state, now, cost, step.op === "acquire");
      state = out.state;
      assert.deepEqual(out.reply, step.expect, `${c.name}, step ${i}: ${JSON.stringify(step)}`);
      steps++;
    });
  }
  assert.ok(steps > 100);
});

test("doubles convert to their exact value", () => {
  const tenth = fromDouble(0.1);
  assert.equal(tenth.n, 3602879701896397n);
  assert.equal(tenth.d, 36028797018963968n);
  assert.equal(fromDouble(5).n, 5n);
  assert.equal(fromDouble(1e-6).n, 4722366482869645n); // a bit below 1e-6, as Python says
  assert.equal(fromDouble(1e-6).d, 4722366482869645213696n);
  assert.equal(new Q(-7n, 2n).floor(), -4n);
  assert.equal(new Q(7n, 2n).ceil(), 4n);
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
    const limit = new Limit(Number(c.rate), Number(c.capacity));
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
