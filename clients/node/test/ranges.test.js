// The library's ranges and error texts are clients/vectors/ranges.json's: the package ships
// that file, and every boundary case in it gets the file's answer here, before any I/O (the
// module's own answers to the same cases are checked by tests/ranges.rs on a real server).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Limit, Limiter, RANGES } from "../src/index.js";

const shared = JSON.parse(readFileSync(new URL("../../vectors/ranges.json", import.meta.url), "utf8"));

test("the package ships clients/vectors/ranges.json", () => {
  assert.equal(readFileSync(new URL("../src/ranges.json", import.meta.url), "utf8"),
    readFileSync(new URL("../../vectors/ranges.json", import.meta.url), "utf8"));
  assert.deepEqual(RANGES, shared);
});

/** The case's limit as a caller writes it: a number, or N/S as `per`. */
function limitOf(c) {
  const [count, per] = c.rate.split("/").map(Number);
  return new Limit(count, Number(c.capacity), { per });
}

test("every boundary case gets the shared answer, before any I/O", async () => {
  // A client that must never be reached: validation comes first.
  const unreachable = { call: () => { throw new Error("Redis was called"); } };
  const limiter = new Limiter(unreachable, { onError: "closed" });
  assert.ok(shared.cases.length >= 20);
  for (const c of shared.cases) {
    let error = null;
    try {
      limitOf(c);
    } catch (e) {
      assert.ok(e instanceof RangeError, c.name);
      error = e.message;
    }
    if (error === null && c.error === "cost") {
      await assert.rejects(limiter.peek("k", limitOf(c), Number(c.cost)), (e) => {
        error = e.message;
        return e instanceof RangeError;
      }, c.name);
    }
    assert.equal(error, c.error === null ? null : shared[c.error].error, c.name);
  }
});
