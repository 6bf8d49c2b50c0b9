// All or nothing across hash slots: `limiter.acquireAcrossSlots(items)` takes every item's
// cost, or none, even when the keys sit in different slots of a cluster, where one
// RL.ACQUIRE.MULTI (or rl_multi, or the script's multi) cannot reach them all. The same
// semantics as the Rust client's acquire_across_slots (clients/rust/src/slots.rs).
//
// On one server it is one acquireAll: atomic. On a cluster (a cluster client, or a CROSSSLOT
// reply learnt once) the items are grouped by hash slot and taken group by group, in slot
// order; when a later group refuses (or fails), the groups already taken are refunded, so a
// refused call costs nothing. Between a take and its refund (one round trip) another call can
// see those buckets short of the refunded tokens: that is the one window where a cluster is
// not atomic.
//
// A shadow item (Envoy's shadow_mode) is counted and reported but never refuses the call: when
// only shadow items refuse, they are left out, take nothing, and the rest is asked again.
// Each group goes through the limiter's own acquireAll and refund, so the deny cache and the
// failure policy apply to each unchanged. This file imports nothing of index.js.

import { replyText } from "./adapter.js";

/**
 * The cluster hash slot of `key`: CRC16/XMODEM mod 16384 of its UTF-8 bytes, or of its first
 * non-empty `{hash tag}` (the Redis Cluster specification).
 */
export function keySlot(key) {
  let bytes = Buffer.from(String(key), "utf8");
  const open = bytes.indexOf(0x7b); // {
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1); // }
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/**
 * acquireAcrossSlots's answer. `allowed`: every item's cost was taken (shadow items that
 * refused aside); `retryAfterMs`: the refusing group's longest wait, -1 if an item can never
 * succeed, 0 if allowed; `outcomes`: one per item, in the items' order, `{ status, decision }`
 * with status "taken" (taken and kept), "refused" (it refused, so nothing was taken; decision
 * null when the deny cache answered), "shadowRefused" (a shadow item that refused: it took
 * nothing, the others went on) or "notTaken" (another item refused: its own decision, allowed
 * or taken then refunded, or null when its group was never asked); `sources`: who decided
 * each acquireAll sent, in order ("closed" among them: Redis could not decide).
 */
export class SlotsDecision {
  constructor(allowed, retryAfterMs, outcomes, sources) {
    this.allowed = Boolean(allowed);
    this.retryAfterMs = Number(retryAfterMs);
    this.outcomes = outcomes;
    this.sources = sources;
  }
}

const isCrossSlot = (error) => replyText(error).startsWith("CROSSSLOT");

/** The groups of item indexes: one of all, or one per slot in slot order. */
function grouped(items, bySlot) {
  const groups = new Map();
  items.forEach(({ key }, i) => {
    const slot = bySlot ? keySlot(key) : 0;
    if (!groups.has(slot)) groups.set(slot, []);
    groups.get(slot).push(i);
  });
  return [...groups.entries()].sort(([a], [b]) => a - b).map(([, indexes]) => indexes);
}

/**
 * Runs one acquireAcrossSlots over `items`, [{ key, limit, cost, shadow }] with costs already
 * checked, through `limiter.acquireAll` and `limiter.refund`.
 */
export async function acrossSlots(limiter, items) {
  const outcomes = items.map(() => ({ status: "notTaken", decision: null }));
  const sources = [];
  let bySlot = limiter.redis.cluster || limiter.slotted === true;
  let groups = grouped(items, bySlot);
  let taken = [];
  const args = (indexes) => indexes.map((i) => [items[i].key, items[i].limit, items[i].cost]);

  /** Gives back what earlier groups took, then ends with `result` (or throws `error`). */
  const end = async (result, error) => {
    for (const i of taken) {
      outcomes[i].status = "notTaken";
      const { key, limit, cost } = items[i];
      try {
        await limiter.refund(key, limit, cost);
      } catch (e) {
        limiter.logger.warn(`redis-rl: giving back ${JSON.stringify(String(key))} after a refusal failed: ${e.message}`);
      }
    }
    taken = [];
    if (error) throw error;
    return result;
  };

  for (let g = 0; g < groups.length; g++) {
    let asking = groups[g];
    for (;;) {
      let multi;
      try {
        multi = await limiter.acquireAll(args(asking));
      } catch (error) {
        if (!bySlot && taken.length === 0 && isCrossSlot(error)) {
          // A cluster: nothing was taken, so start again group by group, and remember it.
          limiter.slotted = true;
          bySlot = true;
          groups = grouped(items, true);
          g = -1;
          break;
        }
        return end(null, error);
      }
      sources.push(multi.source);
      if (multi.allowed) {
        asking.forEach((i, pos) => { outcomes[i] = { status: "taken", decision: multi.decisions[pos] ?? null }; });
        taken.push(...asking);
        break;
      }
      // Which items refused: each decision says so; the deny cache knows only the first.
      const refusing = multi.decisions.length === 0
        ? [asking[multi.refusedIndex]].filter((i) => i !== undefined)
        : asking.filter((_, pos) => !multi.decisions[pos].allowed);
      const decisionOf = (i) => multi.decisions[asking.indexOf(i)] ?? null;
      if (refusing.length > 0 && refusing.every((i) => items[i].shadow)) {
        for (const i of refusing) outcomes[i] = { status: "shadowRefused", decision: decisionOf(i) };
        asking = asking.filter((i) => !refusing.includes(i));
        if (asking.length === 0) break;
        continue;
      }
      for (const i of asking) {
        const status = refusing.includes(i) ? (items[i].shadow ? "shadowRefused" : "refused") : "notTaken";
        outcomes[i] = { status, decision: decisionOf(i) };
      }
      return end(new SlotsDecision(false, multi.retryAfterMs, outcomes, sources));
    }
  }
  return new SlotsDecision(true, 0, outcomes, sources);
}
