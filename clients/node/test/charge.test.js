// Post-paid charges (Limiter.charge, Table.charge): the pure bucket's exact charge against
// hand-worked rationals at rates whose 1e9/rate is not whole (3/s, "3/10", 7/s), the failure
// policies when Redis cannot be reached, and the module's RL.CHARGE / RL.HCHARGE and the Lua
// script's "charge" mode on real servers, through ioredis and node-redis.
import { test } from "node:test";
import assert from "node:assert/strict";
import Redis from "ioredis";
import { createClient } from "redis";
import { acquire, charge, Q } from "../src/bucket.js";
import { Charge, DebtTooLongError, Limit, Limiter, LocalBuckets, RANGES } from "../src/index.js";
import { withCleanups } from "./servers.js";

const T0_US = 1_700_000_000_000_000n;
const MAX_DEBT_NS = new Q(BigInt(RANGES.refill.max_s) * 1_000_000_000n);
const SLOW = new Limit(0.001, 2); // no refill can matter while a test runs
const quiet = { warn() {}, info() {} };

test("a charge at 3/s goes into debt and is repaid to the nanosecond", () => {
  const rate = new Q(3n), capacity = new Q(2n);
  // 5 tokens on a full bucket of 2: balance -3; 3 tokens of debt are 3 x 1e9/3 ns = 1 s
  // exactly; full after 5 x 1e9/3 ns = 1666.67 ms, rounded up.
  const { reply, state } = charge(rate, capacity, null, T0_US, new Q(5n), MAX_DEBT_NS);
  assert.deepEqual(reply, [1, -3, 1000, 1667]);
  // A check of cost 0 is denied while in debt: 1 µs before it is repaid, 1 ns is a 1 ms wait.
  const before = acquire(rate, capacity, state, T0_US + 999_999n, new Q(0n));
  assert.deepEqual(before.reply.slice(0, 3), [0, 0, 1]);
  assert.equal(before.state, state);
  assert.deepEqual(acquire(rate, capacity, state, T0_US + 1_000_000n, new Q(0n)).reply.slice(0, 3), [1, 0, 0]);
  // Half a second in: 2 - 3.5 = -1.5 tokens, toward -infinity for a peek, 0 for a take.
  assert.equal(acquire(rate, capacity, state, T0_US + 500_000n, new Q(1n), false).reply[1], -2);
  assert.equal(acquire(rate, capacity, state, T0_US + 500_000n, new Q(1n)).reply[1], 0);
});

test("a charge at 3/10 s adds to the debt already there; cost 0 changes nothing", () => {
  const rate = new Q(3n, 10n), capacity = new Q(1n);
  let out = charge(rate, capacity, null, T0_US, new Q(2n), MAX_DEBT_NS);
  assert.deepEqual(out.reply, [1, -1, 3334, 6667]); // T = 10/3 s
  out = charge(rate, capacity, out.state, T0_US, Q.of(0.1), MAX_DEBT_NS);
  assert.deepEqual(out.reply, [1, -2, 3667, 7000]); // 2.1 T owed on a capacity of 1
  const again = charge(rate, capacity, out.state, T0_US, new Q(0n), MAX_DEBT_NS);
  assert.equal(again.state, out.state);
  assert.deepEqual(again.reply, [1, -2, 3667, 7000]);
  // 7/s, capacity 3, 4 tokens: full after 4/7 s, repaid after 1/7 s (142.86 ms).
  assert.deepEqual(charge(new Q(7n), new Q(3n), null, T0_US, new Q(4n), MAX_DEBT_NS).reply, [1, -1, 143, 572]);
});

test("a charge past a hundred years of debt is refused and writes nothing", () => {
  const bound = BigInt(RANGES.refill.max_s); // tokens at one a second
  assert.equal(charge(new Q(1n), new Q(1n), null, T0_US, new Q(bound), MAX_DEBT_NS).reply[1], 1 - Number(bound));
  assert.throws(() => charge(new Q(1n), new Q(1n), null, T0_US, new Q(bound * 1_000_000n + 1n, 1_000_000n), MAX_DEBT_NS),
    (e) => e instanceof DebtTooLongError && /^cost would leave the bucket in debt/.test(e.message));
  const local = new LocalBuckets(1);
  assert.throws(() => local.charge("k", new Limit(1, 1), Number(bound) + 1, T0_US, MAX_DEBT_NS), DebtTooLongError);
  assert.equal(local.size, 0);
});

/** A limiter whose server has gone: every call fails at once, and the policy decides. */
async function downLimiter(scope, onError, logger = quiet) {
  const server = await scope.server(true);
  const client = new Redis({ port: server.port, host: "127.0.0.1", enableOfflineQueue: false, lazyConnect: true,
    retryStrategy: () => 50, maxRetriesPerRequest: 0 });
  client.on("error", () => {});
  await client.connect();
  scope.defer(() => client.disconnect());
  await server.stop();
  return new Limiter(client, { onError, logger, timeoutMs: 500 });
}

test("under local a charge Redis cannot take is applied to the local bucket", () => withCleanups(async (scope) => {
  const limiter = await downLimiter(scope, "local");
  const c = await limiter.charge("k", SLOW, 5);
  assert.ok(c instanceof Charge);
  assert.deepEqual([c.applied, c.source, c.remaining, c.inDebt], [true, "local", -3, true]);
  assert.ok(c.retryAfterMs > 0);
  assert.equal((await limiter.acquire("k", SLOW, 0)).allowed, false);
  const peeked = await limiter.peek("k", SLOW, 0);
  assert.equal(peeked.remaining, -3);
  assert.equal(peeked.headers()["X-RateLimit-Remaining"], "0"); // a header field is never negative
}));

test("under open and closed a charge Redis cannot take is recorded nowhere, and says so", () => withCleanups(async (scope) => {
  for (const policy of ["open", "closed"]) {
    const warned = [];
    const limiter = await downLimiter(scope, policy, { warn: (m) => warned.push(m), info() {} });
    const c = await limiter.charge("usage:42", SLOW, 7);
    assert.deepEqual([c.applied, c.source], [false, policy]);
    assert.ok(warned.some((m) => m.includes('a charge of 7 on "usage:42" was not applied')), warned.join("\n"));
    assert.equal(limiter.counters.unappliedCharges, 1);
  }
}));

test("a charge needs a valid cost, checked before any call", () => withCleanups(async (scope) => {
  const limiter = await downLimiter(scope, "local");
  await assert.rejects(limiter.charge("k", SLOW), TypeError);
  for (const cost of [-1, NaN, "x"]) await assert.rejects(limiter.charge("k", SLOW, cost), /cost must be/);
  assert.equal(limiter.counters.local, 0);
}));

const CLIENTS = {
  async ioredis(port) {
    const c = new Redis({ port, host: "127.0.0.1", lazyConnect: true });
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  },
  async "node-redis"(port) {
    const c = createClient({ socket: { port, host: "127.0.0.1" } });
    await c.connect();
    return { client: c, close: () => c.destroy() };
  },
};

for (const [name, connect] of Object.entries(CLIENTS)) {
  for (const module of [true, false]) {
    const source = module ? "redis" : "lua";
    test(`${name}: charge and table charge on the ${source} path, with a signed balance`, () => withCleanups(async (scope) => {
      const server = await scope.server(module);
      const { client, close } = await connect(server.port);
      scope.defer(close);
      const limiter = new Limiter(client, { onError: "closed", logger: quiet });
      const c = await limiter.charge("k", SLOW, 5);
      assert.deepEqual([c.applied, c.source, c.remaining], [true, source, -3]);
      // 3 tokens owed at one per 1000 s, 5 to full (the test's few ms on the server's clock).
      assert.ok(Math.abs(c.retryAfterMs - 3_000_000) <= 100, String(c.retryAfterMs));
      assert.ok(Math.abs(c.resetAfterMs - 5_000_000) <= 100, String(c.resetAfterMs));
      const d = await limiter.acquire("k", SLOW, 0);
      assert.deepEqual([d.allowed, d.remaining], [false, 0]);
      assert.equal((await limiter.peek("k", SLOW, 0)).remaining, -3);
      await assert.rejects(limiter.charge("k", SLOW, 4_000_000), DebtTooLongError);
      assert.equal((await limiter.peek("k", SLOW, 0)).remaining, -3); // nothing was written
      const table = limiter.table("usage", 2);
      const t = await table.charge("alice", SLOW, 3);
      assert.deepEqual([t.applied, t.source, t.remaining], [true, source, -1]);
      assert.equal((await table.acquire("alice", SLOW)).allowed, false);
      assert.equal((await table.peek("alice", SLOW, 0)).remaining, -1);
      assert.equal(limiter.counters[source], 7);
    }));
  }
}
