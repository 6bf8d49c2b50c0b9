// Bucket tables: many buckets in a few keys, spread over a cluster (docs/tables.md).
//
// `limiter.table(name, shards)` (or `limiter.table(name, { shards, expectedBuckets })`, where
// expectedBuckets alone picks shardsFor(expectedBuckets) shards so that no table holds more than
// MAX_BUCKETS_PER_TABLE buckets) gives a Table whose buckets are named by fields. A field lives
// in the table `name:{i}` with i = shardOf(field, shards), so one limit's fields spread over
// `shards` keys, each in the slot of its hash tag `{i}`. With the module the calls are
// RL.HACQUIRE, RL.HPEEK, RL.HREFUND, RL.HDEL and RL.HLEN on those keys; without it, the
// Functions library and the shipped Lua script keep one key per field, `name:{i}:field`,
// under the same hash tag.
//
// Decisions go through the limiter that made the table (its failure policy, deny cache and
// module detection); a field is known to them by its fallback key. The same names as the
// Python (redis_rl.table) and Rust (redis_rl_client::Table) libraries.

import { createHash } from "node:crypto";

/** The most shards a limit may be spread over: there are no more slots than this. */
export const MAX_SHARDS = 16384;
/** The most fields delete sends in one command, so no one call keeps the server long. */
export const DELETE_BATCH = 1000;
/**
 * The most buckets `expectedBuckets` puts in one table: the largest table whose MIGRATE (what
 * resharding a cluster does to a key) measured under 100 ms, from the run of `make bench-tables`
 * in bench/tables.md (125,976, rounded down to a thousand; Redis 7.0.15 on a shared 2-core
 * machine, docs/tables.md#choosing-shards). A bigger table blocks the node that moves it for longer. The Python and Rust libraries use the same figure.
 */
export const MAX_BUCKETS_PER_TABLE = 125_000;

/**
 * How many tables keep `expectedBuckets` buckets at MAX_BUCKETS_PER_TABLE or fewer each:
 * max(1, ceil(expectedBuckets / MAX_BUCKETS_PER_TABLE)).
 */
export function shardsFor(expectedBuckets) {
  if (!Number.isSafeInteger(expectedBuckets) || expectedBuckets < 0) {
    throw new RangeError("expectedBuckets must be a non-negative integer");
  }
  const shards = Math.max(1, Math.ceil(expectedBuckets / MAX_BUCKETS_PER_TABLE));
  if (shards > MAX_SHARDS) {
    throw new RangeError(`expectedBuckets ${expectedBuckets} needs ${shards} shards of at most ` +
      `${MAX_BUCKETS_PER_TABLE} buckets, more than the ${MAX_SHARDS} there can be`);
  }
  return shards;
}

/**
 * The shard count of limiter.table: `shards` if given, else shardsFor(expectedBuckets) if that
 * is given, else 1. Given both, too few shards for the expected buckets is allowed (a single
 * server never moves its keys) but warned of on `logger`, naming the count that fits.
 */
function resolveShards(name, options, logger) {
  const { shards, expectedBuckets } = typeof options === "object" && options !== null ? options : { shards: options };
  if (expectedBuckets === undefined) return shards ?? 1;
  const needed = shardsFor(expectedBuckets);
  if (shards === undefined) return needed;
  if (Number.isInteger(shards) && shards >= 1 && shards < needed) {
    logger?.warn?.(`redis-rl: table ${JSON.stringify(name)}: ${shards} shards for ${expectedBuckets} expected ` +
      `buckets put up to ${Math.ceil(expectedBuckets / shards)} in one table, more than the ` +
      `${MAX_BUCKETS_PER_TABLE} whose MIGRATE stays under 100 ms; ${needed} shards would keep each under it`);
  }
  return shards;
}

/**
 * The shard of `field` among `shards`: the first 8 bytes of SHA-1 over its UTF-8 bytes,
 * big-endian, modulo `shards` (clients/vectors/table.json holds the cases all three share).
 */
export function shardOf(field, shards) {
  const digest = createHash("sha1").update(field, "utf8").digest();
  return Number(digest.readBigUInt64BE(0) % BigInt(shards));
}

function checkField(field) {
  if (typeof field !== "string") throw new TypeError("field must be a string (encode binary names, e.g. as hex)");
  return field;
}

/**
 * SCAN MATCH for every fallback key of table `name`, `name:{*}:*`, the name's glob characters
 * escaped; Table.ours then keeps the keys of shards below `shards`.
 */
const luaPattern = (name) => name.replace(/[*?[\]\\]/g, (c) => `\\${c}`) + ":{*}:*";

/**
 * A limit's buckets named by field, over `shards` tables. acquire, peek, charge, refund, reserve
 * and settle take and reply as the limiter's methods, with a field for the key. delete(...fields) resets buckets
 * and resolves to how many were live (not full); len() counts the live buckets over all the
 * shards. Those two are not decisions: when Redis cannot answer they reject, whatever the
 * failure policy.
 */
export class Table {
  /** `options`: a shard count, or `{ shards, expectedBuckets }` (see resolveShards). */
  constructor(limiter, name, options = 1) {
    if (typeof name !== "string" || name === "") throw new RangeError("name must be a non-empty string");
    // A brace in the name would become the hash tag and put every shard in one slot.
    if (/[{}]/.test(name)) throw new RangeError("name must not contain { or } (the shard index is the hash tag)");
    const shards = resolveShards(name, options, limiter ? limiter.logger : console);
    if (!Number.isInteger(shards) || shards < 1 || shards > MAX_SHARDS) {
      throw new RangeError(`shards must be an integer from 1 to ${MAX_SHARDS}`);
    }
    this.limiter = limiter;
    this.name = name;
    this.shards = shards;
    Object.freeze(this);
  }

  /** The table key of shard `shard`: `name:{shard}`. */
  key(shard) {
    return `${this.name}:{${shard}}`;
  }

  /** The bucket of `field`: its table key, the field, and its fallback key. */
  bucket(field) {
    const table = this.key(shardOf(checkField(field), this.shards));
    return { table, field, key: `${table}:${field}` };
  }

  /** Takes `cost` tokens (default 1) from the bucket `field` of `limit`. */
  acquire(field, limit, cost = 1) {
    const b = this.bucket(field);
    return this.limiter.acquire(b.key, limit, cost, b);
  }

  /** What acquire would decide for `cost`, taking nothing. */
  peek(field, limit, cost = 1) {
    const b = this.bucket(field);
    return this.limiter.peek(b.key, limit, cost, b);
  }

  /** Applies the post-paid `cost` to the bucket `field`, into debt if need be (RL.HCHARGE;
   * see Limiter.charge): resolves to a Charge. */
  charge(field, limit, cost) {
    const b = this.bucket(field);
    return this.limiter.charge(b.key, limit, cost, b);
  }

  /** Gives `cost` tokens back to the bucket `field` and clears its deny-cache entry. */
  refund(field, limit, cost = 1) {
    const b = this.bucket(field);
    return this.limiter.refund(b.key, limit, cost, b);
  }

  /** Takes `estimate` tokens from the bucket `field` now and records the take for `ttlMs`
   * (RL.HRESERVE; on the fallbacks the reserve of the field's own key): resolves to a
   * Reservation whose settle(actual) settles it on that bucket (RL.HSETTLE). */
  reserve(field, limit, estimate, ttlMs, id = undefined) {
    const b = this.bucket(field);
    return this.limiter.reserve(b.key, limit, estimate, ttlMs, id, b);
  }

  /** Settles the reservation `id` of the bucket `field` by id (RL.HSETTLE), as Limiter.settle. */
  settle(field, limit, id, actual) {
    const b = this.bucket(field);
    return this.limiter.settle(b.key, limit, id, actual, b);
  }

  /** Resets the buckets of `fields` (full again); resolves to how many were live. */
  async delete(...fields) {
    const groups = new Map(); // table key -> buckets, distinct fields in the order given
    for (const field of new Set(fields.map(checkField))) {
      const b = this.bucket(field);
      if (!groups.has(b.table)) groups.set(b.table, []);
      groups.get(b.table).push(b);
    }
    const limiter = this.limiter;
    for (const bs of groups.values()) {
      for (const b of bs) {
        limiter.cache.delete(b.key);
        limiter.local.store(b.key, null); // a forgotten local bucket is full
      }
    }
    const module = (await this.path()) === "module";
    let deleted = 0;
    for (const [table, bs] of groups) {
      for (let start = 0; start < bs.length; start += DELETE_BATCH) {
        const batch = bs.slice(start, start + DELETE_BATCH);
        const args = module ? ["RL.HDEL", table, ...batch.map((b) => b.field)] : ["DEL", ...batch.map((b) => b.key)];
        deleted += Number(await limiter.deadline(limiter.redis.send(args, table)));
      }
    }
    return deleted;
  }

  /** Live buckets over all the shards (RL.HLEN; on the other paths, SCAN of the fallback keys). */
  async len() {
    const limiter = this.limiter;
    const module = (await this.path()) === "module";
    let count = 0;
    if (module) {
      for (let i = 0; i < this.shards; i++) {
        const table = this.key(i);
        count += Number(await limiter.deadline(limiter.redis.send(["RL.HLEN", table], table)));
      }
      return count;
    }
    for (const node of await this.scanNodes()) {
      let cursor = "0";
      do {
        const [next, keys] = await limiter.deadline(node(["SCAN", cursor, "MATCH", luaPattern(this.name), "COUNT", "1000"]));
        cursor = String(next);
        count += this.ours(keys);
      } while (cursor !== "0");
    }
    return count;
  }

  /** Where the fallback keys are: every master of a cluster (each key is on one), or the server. */
  async scanNodes() {
    const { redis } = this.limiter;
    return redis.masters ? redis.masters() : [(args) => redis.send(args)];
  }

  /**
   * How many of SCAN's `keys` are fallback keys of a shard below `shards`: the pattern also
   * matches `name:{x}:…` for any x, such as the shards of a larger S.
   */
  ours(keys) {
    const prefix = `${this.name}:{`;
    let count = 0;
    for (const raw of keys) {
      const key = String(raw);
      const end = key.indexOf("}:", prefix.length);
      const index = key.slice(prefix.length, end);
      if (key.startsWith(prefix) && end > 0 && /^(0|[1-9][0-9]*)$/.test(index) && Number(index) < this.shards) count++;
    }
    return count;
  }

  async path() {
    const limiter = this.limiter;
    if (limiter.path === null) await limiter.findPath();
    return limiter.path;
  }
}
