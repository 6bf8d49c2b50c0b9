// The call into Redis, for either client: ioredis (Redis, Cluster) or node-redis (v4/v5
// createClient, createCluster). One method, send(args, key), returning the raw reply; key
// routes the command in a cluster. A cluster also gives masters(): each master's send, for SCAN.

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

/** Wraps a client into {send(args, key), cluster}. */
export function adapt(client) {
  if (client && typeof client.call === "function") {
    // ioredis: Cluster routes by the key it finds for known commands and follows MOVED for
    // the module's commands, which it does not know.
    return {
      cluster: client.isCluster === true,
      send: (args) => client.call(args[0], ...args.slice(1)),
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
