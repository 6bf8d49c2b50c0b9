// Types for redis-rl's Node client (src/index.js).

/** Who decided: the module ("redis"), the Functions library, the script ("lua"), the deny
 * cache, or the failure policy. */
export type Source = "redis" | "functions" | "lua" | "cache" | "local" | "open" | "closed";
/** The path a limiter found: the module, the Functions library redis_rl, or the script. */
export type Path = "module" | "functions" | "lua";
export type OnError = "open" | "closed" | "local";

/** A number, or its decimal text ("0.1", "60"), read exactly. */
export type Amount = number | string;

/** A validated limit: `rate` tokens per second, a burst of `capacity` tokens; or `rate`
 * tokens per `per` seconds, sent as "rate/per" (capacity defaults to the count). Numbers mean
 * their shortest decimal (`0.1` is one tenth exactly). Throws a RangeError naming the
 * argument (the text of clients/vectors/ranges.json) when the module would refuse it. */
export class Limit {
  constructor(rate: Amount, capacity: Amount, options?: { per?: Amount });
  constructor(count: Amount, options: { per: Amount });
  constructor(limit: { rate: Amount; capacity?: Amount; per?: Amount });
  /** Tokens per second (the nearest double; the module gets the exact `rateText`). */
  readonly rate: number;
  readonly capacity: number;
  /** The period in seconds, when the limit was given one. */
  readonly per: number | undefined;
  /** What is sent: "5", "0.1", "100/60", "1e-7". */
  readonly rateText: string;
  readonly capacityText: string;
  equals(other: Limit): boolean;
  /** `rate capacity` as the module's arguments. */
  args(): [string, string];
  /** The 10 numbers clients/lua/rl.lua takes for this limit and cost. */
  scriptArgs(cost: number, refund?: boolean): string[];
  /** The same 10 numbers packed in one argument of 80 bytes: little-endian doubles, as the script and the Functions library (version 3 on) read them fastest. */
  scriptPacked(cost: number, refund?: boolean): Uint8Array;
}

export class Decision {
  readonly allowed: boolean;
  /** Whole tokens left after this call: never below 0 for a take; a peek's is the signed
   * balance, negative while a charge keeps the bucket in debt. */
  readonly remaining: number;
  /** 0 when allowed; the wait (ms, rounded up) when denied; -1 when cost > capacity. */
  readonly retryAfterMs: number;
  /** Until the bucket is full, ms rounded up. */
  readonly resetAfterMs: number;
  readonly limit: Limit;
  readonly source: Source;
  /** X-RateLimit-Limit, -Remaining, -Reset, and Retry-After when denied; under "open" or "closed", X-RateLimit-Limit (and Retry-After) only. */
  headers(): Record<string, string>;
}

export class MultiDecision {
  readonly allowed: boolean;
  /** The first refusing item, -1 when allowed. */
  readonly refusedIndex: number;
  /** The longest wait among the refusing items, -1 if one can never succeed. */
  readonly retryAfterMs: number;
  /** One per item; empty when source is "cache". */
  readonly decisions: Decision[];
  readonly source: Source;
}

/** charge's answer: a post-paid cost applied, perhaps into debt. */
export class Charge {
  /** False only when the "open" or "closed" policy answered: recorded nowhere (logged and
   * counted in counters.unappliedCharges; send it again). */
  readonly applied: boolean;
  /** The signed balance in whole tokens, rounded toward -infinity: negative in debt. */
  readonly remaining: number;
  /** The wait until the debt is repaid, ms rounded up; 0 when not in debt. */
  readonly retryAfterMs: number;
  /** Until the bucket is full, ms rounded up. */
  readonly resetAfterMs: number;
  readonly limit: Limit;
  readonly source: Source;
  /** remaining < 0: every take is denied until retryAfterMs. */
  readonly inDebt: boolean;
}

/** A charge would leave the bucket short of full for more than 100 years (nothing written). */
export class DebtTooLongError extends RangeError {}

export class Refund {
  readonly remaining: number;
  readonly resetAfterMs: number;
  readonly source: Source;
}

/** The module's ranges and error texts (clients/vectors/ranges.json). */
export const RANGES: {
  rate: { min: string; max: string; error: string };
  capacity: { above: string; max: string; error: string };
  refill: { max_s: string; error: string };
  cost: { min: string; error: string };
  cases: { name: string; rate: string; capacity: string; cost: string; error: "rate" | "capacity" | "refill" | "cost" | null }[];
};

export class RateLimitError extends Error {}
/** Redis refused the limiter for a reason no retry cures (a wrong password, a user without the
 * permissions of any path, a cluster client on a standalone server or a single-node client on
 * a cluster, no module under withoutModule "refuse"): check() rejects with it; at run time the
 * policy decides, logged at error level and counted in counters.misconfigured. */
export class MisconfiguredError extends RateLimitError {
  readonly cause?: unknown;
}
/** No RL.ACQUIRE on the server, and withoutModule is "refuse". */
export class ModuleMissingError extends MisconfiguredError {}
/** The version of the Functions library redis_rl this client needs. */
export const FUNCTIONS_VERSION: number;
/** FUNCTION LOAD REPLACE of the shipped library on the server, or on every master of a cluster
 * (an admin's call: ACL "+function|load +function|list"); resolves to the version loaded. */
export function loadFunctions(client: Client): Promise<number>;
export const CLOSED_RETRY_AFTER_MS: number;
/** The default deadline of a call (timeoutMs), ms: 2000. */
export const DEFAULT_TIMEOUT_MS: number;

export interface LimiterOptions {
  /** Required: "open" allows, "closed" denies, "local" decides in process with
   * rate / instances and capacity / instances per key, when Redis cannot decide. */
  onError: OnError;
  /** Processes sharing the limit, for "local". Default 1. */
  instances?: number;
  /** The hot-key shield: true (10,000 entries), false (default) or a size bound. */
  denyCache?: boolean | number;
  /** Without the module: the Functions library, else the script ("lua", default), or the
   * module only ("refuse": its absence is a misconfiguration). */
  withoutModule?: "lua" | "refuse";
  /** Each call's deadline, ms, waiting for a connection still opening included: busy is
   * not down, so only after it (or at once on a transport error) does onError decide. Default
   * 2000 (DEFAULT_TIMEOUT_MS). */
  timeoutMs?: number;
  /** During an outage, Redis is tried at most this often (ms). Default 100. */
  probeIntervalMs?: number;
  /** Most buckets kept by "local". Default 100,000. */
  localMaxKeys?: number;
  /** A monotonic clock in ms (tests). Default performance.now. */
  clock?: () => number;
  /** Where outages are logged (warn, once each) and misconfigurations (error, once a minute
   * per cause; warn when there is no error); a move to the module after the fallback met one
   * of its keys (WRONGTYPE) is logged with info, when the logger has it. Default console. */
  logger?: { warn(message: string): void; error?(message: string): void; info?(message: string): void };
}

/** An ioredis Redis or Cluster, or a node-redis client or cluster. */
export type Client = object;
export type Item = [key: string, limit: Limit] | [key: string, limit: Limit, cost: number];
/** An item of acquireAcrossSlots: a shadow item's refusal is reported but refuses nothing. */
export type SlotItem = Item | { key: string; limit: Limit; cost?: number; shadow?: boolean };

/** What became of one item of acquireAcrossSlots. */
export interface SlotOutcome {
  /** "taken": taken and kept; "refused": it refused, nothing was taken (decision null when the
   * deny cache answered); "shadowRefused": a shadow item that refused and took nothing;
   * "notTaken": another item refused (its own decision, or null when its group was never asked). */
  readonly status: "taken" | "refused" | "shadowRefused" | "notTaken";
  readonly decision: Decision | null;
}

/** acquireAcrossSlots's answer. */
export class SlotsDecision {
  /** Every item's cost was taken (shadow items that refused aside). */
  readonly allowed: boolean;
  /** The refusing group's longest wait; -1 if an item can never succeed; 0 if allowed. */
  readonly retryAfterMs: number;
  /** One per item, in the items' order. */
  readonly outcomes: SlotOutcome[];
  /** Who decided each acquireAll sent, in order. */
  readonly sources: Source[];
}

/** The cluster hash slot of a key (CRC16 of it or of its hash tag, mod 16384). */
export function keySlot(key: string): number;

export class Limiter {
  constructor(client: Client, options: LimiterOptions);
  /** Decisions by source, outages seen, and calls refused by a misconfiguration. */
  readonly counters: Record<Source | "outages" | "misconfigured" | "unappliedCharges", number>;
  /** The path found: null before the first call (and while none answers). */
  readonly path: Path | null;
  /** Contacts Redis, finds the path and resolves to it; rejects with a MisconfiguredError for
   * a misconfiguration; resolves to null (logging a warning) when Redis is down or busy. */
  check(): Promise<Path | null>;
  acquire(key: string, limit: Limit, cost?: number): Promise<Decision>;
  peek(key: string, limit: Limit, cost?: number): Promise<Decision>;
  /** All or nothing; in a cluster give every key one hash tag ("{user:42}:s"). */
  acquireAll(items: Item[]): Promise<MultiDecision>;
  /** All or nothing whatever slots the keys hash to: per slot on a cluster, in slot order, the
   * slots taken refunded when a later one refuses (not atomic for that one round trip). */
  acquireAcrossSlots(items: SlotItem[]): Promise<SlotsDecision>;
  /** Gives tokens back and clears the deny cache's entry for `key`. */
  refund(key: string, limit: Limit, cost?: number): Promise<Refund>;
  /** Applies a post-paid cost whatever the bucket holds, into debt if need be (RL.CHARGE);
   * rejects with DebtTooLongError past 100 years of debt. */
  charge(key: string, limit: Limit, cost: number): Promise<Charge>;
  /**
   * A bucket table of this limiter, over `shards` (default 1) tables `name:{0}` …; or, given
   * `{ expectedBuckets }` alone, over `shardsFor(expectedBuckets)` tables. Both given with too
   * few shards for the expected buckets: a warning on the limiter's logger, and `shards` is used.
   */
  table(name: string, options?: number | TableOptions): Table;
  /** A lease at `key` if fewer than `limit` (1 to 10000) are held there, for `ttlMs`; `id`
   * (1 to 16 bytes, not starting with "open:" or "local:") makes a retried take idempotent. When Redis cannot decide: "open" allows
   * (an id "open:…", held nowhere), "closed" denies, "local" takes it in process (an id
   * "local:…", released there even once Redis is back). */
  lease(key: string, limit: number, ttlMs: number, id?: string | { id?: string }): Promise<Lease>;
  /** Gives the lease back: true if it was held (false for an "open" lease, and when Redis
   * cannot answer: it then expires at its ttl). */
  release(key: string, id: string): Promise<boolean>;
  /** The lease now expires `ttlMs` from now: true if it was held. When Redis cannot answer:
   * true under "open", false otherwise. */
  renew(key: string, id: string, ttlMs: number): Promise<boolean>;
  /** The leases held at `key` and the wait for a slot under `limit`; writes nothing. */
  leases(key: string, limit: number): Promise<LeaseCount>;
  /** Runs `fn(lease)` holding a lease: tries again until `options.wait` ms have passed (0, the
   * default: one try; Infinity: no limit; polling from 5 ms up to 1 s, at most the denial's
   * retryAfterMs), then rejects with LeaseTimeoutError; renews it every ttlMs / 2 while fn
   * runs; releases it when fn resolves or throws. Resolves to fn's result. */
  withLease<T>(key: string, limit: number, ttlMs: number, fn: (lease: Lease) => T | Promise<T>, options?: LeaseOptions): Promise<T>;
  /** Takes `estimate` tokens (above 0) now and records a reservation open for `ttlMs`
   * (RL.RESERVE); denied like acquire. */
  reserve(key: string, limit: Limit, estimate: number, ttlMs: number, id?: string | { id?: string }): Promise<Reservation>;
  /** Settles reservation `id` with the actual cost (RL.SETTLE): exactly once; a second settle
   * by id rejects with ReservationNotOpenError. Resolves to a Charge (the signed balance);
   * applied false when Redis cannot answer (counted in counters.unappliedCharges). Prefer
   * `reservation.settle(actual)`. */
  settle(key: string, limit: Limit, id: string, actual: number): Promise<Charge>;
  /** Takes `cost` tokens once the bucket holds them; rejects with WaitTimeoutError after
   * `timeoutMs`, WaitNeverError at once when cost > capacity, the signal's reason on abort
   * (holding no tokens). */
  wait(key: string, limit: Limit, options?: WaitOptions): Promise<Decision>;
}

export interface LeaseOptions {
  /** Try again for this many ms (0, the default: one try; Infinity or null: no limit). */
  wait?: number | null;
  /** false: no renewal while fn runs. Default true. */
  renew?: boolean;
  /** The lease's id (1 to 16 bytes); drawn when left out. */
  id?: string;
  /** Aborting ends the wait for a slot. */
  signal?: AbortSignal;
}

/** The most leases a key may hold (RL.LEASE's cap on limit): 10000. */
export const MAX_LEASES: number;
/** The longest ttl the module takes, ms: 100 years. */
export const MAX_TTL_MS: number;

/** lease's answer. */
export class Lease {
  readonly allowed: boolean;
  /** The lease's id; "" when denied; "open:…" when the "open" policy allowed it. */
  readonly id: string;
  /** Leases held after the call (this one included when allowed). */
  readonly inUse: number;
  /** Until this lease expires, ms (ttlMs when just taken); 0 when denied. */
  readonly expiresInMs: number;
  /** Until a slot frees, ms rounded up; 0 when allowed. */
  readonly retryAfterMs: number;
  readonly key: string;
  readonly limit: number;
  readonly ttlMs: number;
  readonly source: Source;
  /** Set by withLease's renewer when a renewal found the lease no longer held. */
  readonly lost: boolean;
  release(): Promise<boolean>;
  /** Default: the lease's own ttlMs. */
  renew(ttlMs?: number): Promise<boolean>;
  /** X-RateLimit-Limit, X-RateLimit-Remaining (not under "open" or "closed") and, when
   * denied, Retry-After (s, rounded up). */
  headers(): Record<string, string>;
}

/** leases's answer. */
export class LeaseCount {
  readonly inUse: number;
  /** 0 when fewer than the limit are held; else until a slot frees, ms rounded up. */
  readonly retryAfterMs: number;
  readonly limit: number;
  readonly source: Source;
}

/** reserve's answer. */
export class Reservation {
  readonly allowed: boolean;
  /** The reservation's id; "" when denied. */
  readonly id: string;
  /** Whole tokens left after the take (when allowed), or now (when denied). */
  readonly remaining: number;
  /** 0 when allowed; as acquire's when denied (-1: the estimate exceeds the capacity). */
  readonly retryAfterMs: number;
  readonly key: string;
  readonly limit: Limit;
  readonly estimate: number;
  readonly source: Source;
  /** Applies the difference with `actual` once; a second call resolves to the first Charge
   * without sending anything (unless the first was not applied: then it is sent again). */
  settle(actual: number): Promise<Charge>;
}

/** withLease found no free slot within its `wait` (one try when 0); `lease` (also
 * `decision`) is the last denial. */
export class LeaseTimeoutError extends WaitTimeoutError {
  readonly lease: Lease;
}
/** A settle of an id that is no open reservation of the key: settled already, lapsed, or never made. */
export class ReservationNotOpenError extends RateLimitError {}

export interface WaitOptions {
  /** Tokens to take. Default 1. */
  cost?: number;
  /** Give up after this many ms (default: never). */
  timeoutMs?: number;
  /** Aborting ends the wait; no tokens are held afterwards. */
  signal?: AbortSignal;
}

/** `wait` gave up at its timeout; `decision` is the last denial. */
export class WaitTimeoutError extends Error {
  readonly decision: Decision;
}
/** The cost exceeds the limit's capacity: no wait can help. */
export class WaitNeverError extends Error {
  readonly decision: Decision;
}

/** The most shards a table may be spread over (the number of cluster slots). */
export const MAX_SHARDS: number;
/** The most buckets `expectedBuckets` puts in one table: the largest whose MIGRATE measured under 100 ms. */
export const MAX_BUCKETS_PER_TABLE: number;
/** max(1, ceil(expectedBuckets / MAX_BUCKETS_PER_TABLE)); a RangeError past MAX_SHARDS. */
export function shardsFor(expectedBuckets: number): number;
/** The second argument of `limiter.table`. */
export interface TableOptions {
  /** How many tables (default 1, or enough for expectedBuckets). */
  shards?: number;
  /** How many buckets the limit will hold at most: picks the shards when `shards` is not given. */
  expectedBuckets?: number;
}
/** The shard of `field`: the first 8 bytes of SHA-1 over its UTF-8 bytes, big-endian, mod `shards`. */
export function shardOf(field: string, shards: number): number;

/** One field's bucket: its table key `name:{i}`, the field, and its fallback key `name:{i}:field`. */
export interface TableBucket {
  readonly table: string;
  readonly field: string;
  readonly key: string;
}

/** A limit's buckets named by field, over `shards` tables; made by `limiter.table(name, shards)`.
 * The same policy, deny cache and module detection as the limiter that made it. */
export class Table {
  constructor(limiter: Limiter, name: string, shards?: number);
  readonly name: string;
  readonly shards: number;
  /** The table key of one shard: `name:{shard}`. */
  key(shard: number): string;
  bucket(field: string): TableBucket;
  acquire(field: string, limit: Limit, cost?: number): Promise<Decision>;
  peek(field: string, limit: Limit, cost?: number): Promise<Decision>;
  refund(field: string, limit: Limit, cost?: number): Promise<Refund>;
  /** Applies a post-paid cost to the bucket `field`, into debt if need be (RL.HCHARGE). */
  charge(field: string, limit: Limit, cost: number): Promise<Charge>;
  /** Reserves `estimate` tokens of the bucket `field` (RL.HRESERVE); the Reservation settles on it (RL.HSETTLE). */
  reserve(field: string, limit: Limit, estimate: number, ttlMs: number, id?: string | { id?: string }): Promise<Reservation>;
  /** Settles reservation `id` of the bucket `field` by id (RL.HSETTLE), as Limiter.settle. */
  settle(field: string, limit: Limit, id: string, actual: number): Promise<Charge>;
  /** Resets the buckets (full again); how many were live. Rejects when Redis cannot answer. */
  delete(...fields: string[]): Promise<number>;
  /** Live buckets over all the shards. Rejects when Redis cannot answer. */
  len(): Promise<number>;
}

export class LocalBuckets {
  constructor(instances?: number, maxKeys?: number);
  readonly size: number;
}
