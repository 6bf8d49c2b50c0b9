// The exact token bucket in process: the `local` failure policy's decisions.
//
// Pure functions of the old state and the time in exact rationals (BigInt numerator and
// denominator), with the module's semantics: a bucket is the instant `fullAtNs` when it is
// full; with T = 1e9 / rate ns per token, tokens(now) = capacity - max(0, fullAt - now) / T.
// Rate, capacity and cost are the exact values of the decimals the module is sent (String of
// the caller's number: 0.1 is one tenth, not the double nearest it). Nothing here reads a
// clock or touches Redis. Checked against clients/vectors/bucket.json.

/** An exact rational n/d, d > 0, reduced. */
export class Q {
  constructor(n, d = 1n) {
    if (d < 0n) { n = -n; d = -d; }
    const g = gcd(n < 0n ? -n : n, d);
    this.n = g > 1n ? n / g : n;
    this.d = g > 1n ? d / g : d;
  }
  /** A Q as is, a BigInt, or a number's exact decimal value (the module's reading of it). */
  static of(x) { return x instanceof Q ? x : typeof x === "bigint" ? new Q(x) : fromDecimal(numberText(x)); }
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

// The module's decimal grammar (rl_bucket::Decimal::parse): an optional "+", digits with at
// most one point and a digit on at least one side, an optional exponent.
const DECIMAL = /^\+?(?=[0-9]|\.[0-9])([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?$/;

/** The text the module is sent for a finite number: its shortest round-trip decimal
 * (String: "0.1", "1e-7", "2500"), which the module reads as an exact decimal. */
export function numberText(x) {
  if (typeof x !== "number" || !Number.isFinite(x)) throw new RangeError("not a finite number");
  return String(x);
}

/** The exact value of a decimal string in the module's grammar, as a Q. */
export function fromDecimal(text) {
  const m = DECIMAL.exec(text);
  if (!m) throw new RangeError(`not a decimal: ${JSON.stringify(text)}`);
  const [, whole, fraction = "", exp = "0"] = m;
  const digits = BigInt(whole + fraction || "0");
  const shift = BigInt(exp) - BigInt(fraction.length);
  return shift >= 0n ? new Q(digits * 10n ** shift) : new Q(digits, 10n ** -shift);
}

/** The exact tokens per second of a rate string: a decimal, or N/S (N tokens per S seconds). */
export function fromRate(text) {
  const [count, period, ...rest] = text.split("/");
  if (period === undefined) return fromDecimal(count);
  const seconds = fromDecimal(period);
  if (rest.length || seconds.isZero()) throw new RangeError(`not a rate: ${JSON.stringify(text)}`);
  return fromDecimal(count).div(seconds);
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
  // At most the capacity comes back, as the module caps it (a charge can owe more).
  const back = cost.cmp(capacity) > 0 ? capacity : cost;
  let debt = debtOf(fullAtNs, nowNs).sub(back.mul(NS_PER_S).div(rate));
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
