// The exact token bucket in process: the `local` failure policy's decisions.
//
// Pure functions of the old state and the time in exact rationals (BigInt numerator and
// denominator), with the module's semantics: a bucket is the instant `fullAtNs` when it is
// full; with T = 1e9 / rate ns per token, tokens(now) = capacity - max(0, fullAt - now) / T.
// Rate, capacity and cost are the exact values of the doubles the caller holds. Nothing here
// reads a clock or touches Redis. Checked against clients/vectors/bucket.json.

/** An exact rational n/d, d > 0, reduced. */
export class Q {
  constructor(n, d = 1n) {
    if (d < 0n) { n = -n; d = -d; }
    const g = gcd(n < 0n ? -n : n, d);
    this.n = g > 1n ? n / g : n;
    this.d = g > 1n ? d / g : d;
  }
  static of(x) { return x instanceof Q ? x : typeof x === "bigint" ? new Q(x) : fromDouble(x); }
  add(o) { o = Q.of(o); return new Q(this.n * o.d + o.n * this.d, this.d * o.d); }
  sub(o) { o = Q.of(o); return new Q(this.n * o.d - o.n * this.d, this.d * o.d); }
  mul(o) { o = Q.of(o); return new Q(this.n * o.n, this.d * o.d); }
  div(o) { o = Q.of(o); return new Q(this.n * o.d, this.d * o.n); }
  cmp(o) { o = Q.of(o); const a = this.n * o.d, b = o.n * this.d; return a < b ? -1 : a > b ? 1 : 0; }
  floor() { const q = this.n / this.d; return this.n < 0n && q * this.d !== this.n ? q - 1n : q; }
  ceil() { return -new Q(-this.n, this.d).floor(); }
  isZero() { return this.n === 0n; }
}

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a || 1n;
}

/** The exact value of a finite double, as a Q. */
export function fromDouble(x) {
  if (!Number.isFinite(x)) throw new RangeError("not a finite number");
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const bits = view.getBigUint64(0);
  const negative = bits >> 63n;
  const exponent = Number((bits >> 52n) & 0x7ffn);
  const fraction = bits & ((1n << 52n) - 1n);
  const mantissa = exponent === 0 ? fraction : fraction | (1n << 52n);
  const shift = (exponent === 0 ? 1 : exponent) - 1075;
  let q = shift >= 0 ? new Q(mantissa << BigInt(shift)) : new Q(mantissa, 1n << BigInt(-shift));
  if (negative) q = new Q(-q.n, q.d);
  return q;
}

const NS_PER_S = 1_000_000_000n;
const ZERO = new Q(0n);

const msCeil = (ns) => Number(ns.div(1_000_000n).ceil());
const debtOf = (fullAtNs, nowNs) => (fullAtNs === null || fullAtNs.cmp(nowNs) <= 0 ? ZERO : fullAtNs.sub(nowNs));
function remainingOf(rate, capacity, debt) {
  const k = capacity.sub(debt.mul(rate).div(NS_PER_S)).floor();
  return k < 0n ? 0 : Number(k);
}

/**
 * Takes `cost` tokens at `nowUs` (a BigInt) if the bucket holds them, or only looks when
 * `take` is false. `rate`, `capacity`, `cost` are Q; `fullAtNs` is the state (a Q, or null
 * for a missing key, a full bucket). Returns {reply: [allowed, remaining, retryAfterMs,
 * resetAfterMs], state}, `state` being `fullAtNs` itself when nothing changed.
 */
export function acquire(rate, capacity, fullAtNs, nowUs, cost, take = true) {
  const nowNs = new Q(nowUs * 1000n);
  const debt = debtOf(fullAtNs, nowNs);
  if (cost.cmp(capacity) > 0) {
    return { reply: [0, remainingOf(rate, capacity, debt), -1, msCeil(debt)], state: fullAtNs };
  }
  const tNs = new Q(NS_PER_S).div(rate);
  const slack = capacity.sub(cost).mul(tNs);
  if (debt.cmp(slack) > 0) {
    return { reply: [0, remainingOf(rate, capacity, debt), msCeil(debt.sub(slack)), msCeil(debt)], state: fullAtNs };
  }
  if (!take || cost.isZero()) {
    return { reply: [1, remainingOf(rate, capacity, debt), 0, msCeil(debt)], state: fullAtNs };
  }
  const base = fullAtNs !== null && fullAtNs.cmp(nowNs) > 0 ? fullAtNs : nowNs;
  const state = base.add(cost.mul(tNs));
  const after = state.sub(nowNs);
  return { reply: [1, remainingOf(rate, capacity, after), 0, msCeil(after)], state };
}

/** Gives `cost` tokens back, capped at capacity: {reply: [remaining, resetAfterMs], state},
 * `state` null once the bucket is full again (delete the key). */
export function refund(rate, capacity, fullAtNs, nowUs, cost) {
  const nowNs = new Q(nowUs * 1000n);
  let debt = debtOf(fullAtNs, nowNs).sub(cost.mul(NS_PER_S).div(rate));
  if (debt.cmp(ZERO) < 0) debt = ZERO;
  return { reply: [remainingOf(rate, capacity, debt), msCeil(debt)], state: debt.isZero() ? null : nowNs.add(debt) };
}

/**
 * Buckets of rate / instances and capacity / instances per key, in memory, at most `maxKeys`
 * of them (least recently used out; a forgotten bucket is full again).
 */
export class LocalBuckets {
  constructor(instances = 1, maxKeys = 100_000) {
    if (!Number.isInteger(instances) || instances < 1) throw new RangeError("instances must be an integer >= 1");
    if (!Number.isInteger(maxKeys) || maxKeys < 1) throw new RangeError("localMaxKeys must be an integer >= 1");
    this.instances = BigInt(instances);
    this.maxKeys = maxKeys;
    this.fullAt = new Map();
  }

  get size() { return this.fullAt.size; }

  share(limit) {
    return [limit.rateQ.div(this.instances), limit.capacityQ.div(this.instances)];
  }

  store(key, state) {
    this.fullAt.delete(key);
    if (state === null) return;
    this.fullAt.set(key, state);
    while (this.fullAt.size > this.maxKeys) this.fullAt.delete(this.fullAt.keys().next().value);
  }

  acquire(key, limit, cost, nowUs, take = true) {
    const [rate, capacity] = this.share(limit);
    const old = this.fullAt.get(key) ?? null;
    const { reply, state } = acquire(rate, capacity, old, nowUs, Q.of(cost), take);
    if (state !== old) this.store(key, state);
    return reply;
  }

  /** All or nothing over [[key, limit, cost]]: RL.ACQUIRE.MULTI's reply. */
  acquireAll(items, nowUs) {
    const pending = new Map();
    const replies = [];
    for (const [key, limit, cost] of items) {
      const [rate, capacity] = this.share(limit);
      const old = pending.has(key) ? pending.get(key) : this.fullAt.get(key) ?? null;
      const { reply, state } = acquire(rate, capacity, old, nowUs, Q.of(cost));
      pending.set(key, state);
      replies.push(reply);
    }
    const refused = replies.findIndex((r) => !r[0]);
    if (refused >= 0) {
      const waits = replies.filter((r) => !r[0]).map((r) => r[2]);
      return [0, refused, waits.some((w) => w < 0) ? -1 : Math.max(...waits), replies];
    }
    for (const [key, state] of pending) if (state !== (this.fullAt.get(key) ?? null)) this.store(key, state);
    return [1, -1, 0, replies];
  }

  refund(key, limit, cost, nowUs) {
    const [rate, capacity] = this.share(limit);
    const old = this.fullAt.get(key) ?? null;
    const { reply, state } = refund(rate, capacity, old, nowUs, Q.of(cost));
    if (old !== null || state !== null) this.store(key, state);
    return reply;
  }
}
