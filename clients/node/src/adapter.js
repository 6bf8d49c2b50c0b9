// The call into Redis, for either client: ioredis (Redis, Cluster) or node-redis (v4/v5
// createClient, createCluster). One method, send(args, key), returning the raw reply; key
// routes the command in a cluster. A cluster also gives masters(): each master's send, for SCAN.
// And ready(): null when the connection is open, else a promise that settles when it opens (or
// rejects when the client is closed for good): a connection still opening is busy, not down,
// so the limiter waits for it (within its deadline) instead of failing on "Stream isn't
// writeable" (ioredis without an offline queue) or ClientOfflineError (node-redis).

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

/**
 * One shared wait for `client` to emit "ready" (one pair of listeners however many calls
 * wait), or null when `isReady()` already holds. `connectIfIdle` starts a lazy client.
 */
function readiness(client, isReady, isClosed, connectIfIdle) {
  let waiting = null;
  return () => {
    if (isReady()) return null;
    if (isClosed()) return null; // closed by its owner: the send fails at once, an outage
    if (waiting) return waiting;
    connectIfIdle();
    waiting = new Promise((resolve, reject) => {
      const onReady = () => { client.off("end", onEnd); waiting = null; resolve(); };
      const onEnd = () => {
        client.off("ready", onReady);
        waiting = null;
        reject(new Error("the connection was closed while the limiter waited for it to open"));
      };
      client.once("ready", onReady);
      client.once("end", onEnd);
    });
    waiting.catch(() => {});
    return waiting;
  };
}

/** Wraps a client into {send(args, key), cluster, ready()}. */
export function adapt(client) {
  if (client && typeof client.call === "function") {
    // ioredis: Cluster routes by the key it finds for known commands and follows MOVED for
    // the module's commands, which it does not know.
    return {
      cluster: client.isCluster === true,
      send: (args) => client.call(args[0], ...args.slice(1)),
      // Redis and Cluster both have a status; "wait" is lazyConnect before its first command.
      ready: typeof client.status === "string"
        ? readiness(client, () => client.status === "ready", () => client.status === "end",
          () => { if (client.status === "wait") client.connect().catch(() => {}); })
        : () => null,
      // Each master's send, for a command without a key (SCAN) that must reach them all.
      masters: client.isCluster === true
        ? async () => client.nodes("master").map((node) => (args) => node.call(args[0], ...args.slice(1)))
        : null,
    };
  }
  if (client && typeof client.sendCommand === "function") {
    const isCluster = "masters" in client || typeof client.getSlotMaster === "function";
    return {
      cluster: isCluster,
      // A standalone client that was connect()ed (isOpen) but is not ready yet is opening or
      // reconnecting; one never connected is its owner's to open, and fails as an outage.
      ready: !isCluster && typeof client.isReady === "boolean"
        ? readiness(client, () => client.isReady, () => !client.isOpen, () => {})
        : () => null,
      send: isCluster
        ? (args, key) => client.sendCommand(key, false, args)
        : (args) => client.sendCommand(args),
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
