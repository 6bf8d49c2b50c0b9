// The call into Redis, for either client: ioredis (Redis, Cluster) or node-redis (v4/v5/v6
// createClient, createCluster). One method, send(args, key, raw), returning the raw reply; key
// routes the command in a cluster. A cluster also gives masters(): each master's send, for SCAN
// and FUNCTION LOAD. And ready(): null when the connection is open, else a promise that settles
// when it opens (or rejects when the client is closed for good, or at once when the connection
// is refused for a misconfiguration: a wrong password, a cluster client on a standalone server):
// a connection still opening is busy, not down, so the limiter waits for it (within its
// deadline) instead of failing on "Stream isn't writeable" (ioredis without an offline queue)
// or ClientOfflineError (node-redis).
//
// To name the real cause of a failed connection (ECONNREFUSED, ENOTFOUND, WRONGPASS ...)
// instead of a bare deadline, the adapter listens to the client's "error" events and keeps the
// last one until the next "ready" (lastError()). It handles nothing: the client's owner keeps
// their own listener, as each client's documentation asks.

import { createHash } from "node:crypto";

/** Whether an error is a reply from the server (as opposed to a transport failure). */
export function isReplyError(error) {
  if (!error || typeof error !== "object") return false;
  if (error.name === "ReplyError") return true; // ioredis
  for (let c = error.constructor; c && c !== Error; c = Object.getPrototypeOf(c)) {
    if (c.name === "ErrorReply") return true; // node-redis (SimpleError, BlobError extend it)
  }
  return false;
}

export const sha1 = (text) => createHash("sha1").update(text).digest("hex");

/** The text of a reply error, or of the node error behind an ioredis Cluster's "Failed to
 * refresh slots cache" (its lastNodeError); "" for anything else. */
export function replyText(error) {
  if (isReplyError(error)) return error.message;
  if (error && typeof error === "object" && isReplyError(error.lastNodeError)) return error.lastNodeError.message;
  return "";
}

/** Whether a connection error is a misconfiguration that no retry cures: the server refused
 * the credentials, or a cluster client reached a server without cluster support. */
export function isConnectionMisconfigured(error) {
  const text = replyText(error);
  return /^(WRONGPASS|NOAUTH)\b|invalid username-password pair|^ERR AUTH\b|cluster support disabled/i.test(text);
}

/**
 * The last "error" event of `client`: lastError() gives it, answered() forgets it. "ready"
 * forgets a transport error, but not a refused password: ioredis without its ready check
 * emits "ready" right after the server refused AUTH, then reconnects; only a reply forgets it.
 */
function errorWatch(client) {
  let last = null;
  if (typeof client.on === "function") {
    client.on("error", (error) => { last = error; });
    client.on("ready", () => { if (last && !isConnectionMisconfigured(last)) last = null; });
  }
  return { lastError: () => last, answered: () => { last = null; } };
}

/** `send`, forgetting the last connection error once a reply arrives. */
const forgetting = (send, watch) => async (args, key, raw) => {
  const reply = await send(args, key, raw);
  watch.answered();
  return reply;
};

/**
 * One shared wait for `client` to emit "ready" (one pair of listeners however many calls
 * wait), or null when `isReady()` already holds. `connectIfIdle` starts a lazy client.
 */
function readiness(client, isReady, isClosed, connectIfIdle, lastError) {
  let waiting = null;
  return () => {
    if (isReady()) return null;
    if (isClosed()) return null; // closed by its owner: the send fails at once, an outage
    // Refused for a misconfiguration (wrong password ...): no wait cures it.
    const last = lastError();
    if (last && isConnectionMisconfigured(last)) return Promise.reject(last);
    if (waiting) return waiting;
    connectIfIdle();
    waiting = new Promise((resolve, reject) => {
      const settle = () => {
        client.off("ready", onReady);
        client.off("end", onEnd);
        client.off("error", onError);
        waiting = null;
      };
      const onReady = () => { settle(); resolve(); };
      const onEnd = () => {
        settle();
        reject(new Error("the connection was closed while the limiter waited for it to open"));
      };
      const onError = (error) => {
        if (!isConnectionMisconfigured(error)) return; // refused, reset ...: the client retries
        settle();
        reject(error);
      };
      client.once("ready", onReady);
      client.once("end", onEnd);
      client.on("error", onError);
    });
    waiting.catch(() => {});
    return waiting;
  };
}

/** The adapters made so far, one per client: each listens to its client's events once. */
const adapters = new WeakMap();

/**
 * node-redis's options for a command whose bulk strings are wanted as Buffers: v4 reads
 * returnBuffers, v5 and v6 a type mapping of blob strings (RESP type 36, "$") to Buffer.
 */
const BUFFERS = { returnBuffers: true, typeMapping: { 36: Buffer } };

/**
 * Wraps a client into {send(args, key, raw), cluster, ready(), masters, lastError()}. With
 * raw, bulk strings come back as Buffers (the script's packed reply), where both clients
 * otherwise decode them as UTF-8 text.
 */
export function adapt(client) {
  if (client && typeof client === "object" && adapters.has(client)) return adapters.get(client);
  const adapter = makeAdapter(client);
  adapters.set(client, adapter);
  return adapter;
}

function makeAdapter(client) {
  if (client && typeof client.call === "function") {
    // ioredis: Cluster routes by the key it finds for known commands and follows MOVED for
    // the module's commands, which it does not know.
    const watch = errorWatch(client);
    const { lastError } = watch;
    return {
      cluster: client.isCluster === true,
      lastError,
      send: forgetting((args, _key, raw) => (raw ? client.callBuffer : client.call)
        .call(client, args[0], ...args.slice(1)), watch),
      // Redis and Cluster both have a status; "wait" is lazyConnect before its first command.
      ready: typeof client.status === "string"
        ? readiness(client, () => client.status === "ready", () => client.status === "end",
          () => { if (client.status === "wait") client.connect().catch(() => {}); }, lastError)
        : () => null,
      // Each master's send, for a command without a key (SCAN) that must reach them all.
      masters: client.isCluster === true
        ? async () => client.nodes("master").map((node) => (args) => node.call(args[0], ...args.slice(1)))
        : null,
    };
  }
  if (client && typeof client.sendCommand === "function") {
    const isCluster = "masters" in client || typeof client.getSlotMaster === "function";
    const watch = errorWatch(client);
    const { lastError } = watch;
    return {
      cluster: isCluster,
      lastError,
      // A standalone client that was connect()ed (isOpen) but is not ready yet is opening or
      // reconnecting; one never connected is its owner's to open, and fails as an outage.
      ready: !isCluster && typeof client.isReady === "boolean"
        ? readiness(client, () => client.isReady, () => !client.isOpen, () => {}, lastError)
        : () => null,
      send: forgetting(isCluster
        ? async (args, key, raw) => {
          try {
            return await client.sendCommand(key, false, args, raw ? BUFFERS : undefined);
          } catch (error) {
            // A cluster that never learnt its slots (its connect failed) throws a TypeError
            // from its slot table: say what it means, and why when its events told.
            if (!(error instanceof TypeError)) throw error;
            const last = lastError();
            if (last && isConnectionMisconfigured(last)) throw last;
            throw new Error(`the cluster client knows no slots to send to (was its connect() refused?${
              last ? ` last error: ${last.message}` : ""})`);
          }
        }
        : (args, _key, raw) => client.sendCommand(args, raw ? BUFFERS : undefined), watch),
      masters: isCluster
        ? async () => Promise.all((client.masters ?? client.getMasters()).map(async (node) => {
          const nodeClient = await client.nodeClient(node);
          return (args) => nodeClient.sendCommand(args);
        }))
        : null,
    };
  }
  throw new TypeError("redis-rl: pass an ioredis client (Redis or Cluster) or a node-redis client or cluster");
}
