// The paths without privileges: which errors mean a path is absent, which are a
// misconfiguration (and what to tell the user), the script's EVALSHA and EVAL, and loading the
// Functions library (an admin's one call). Detection itself is the limiter's (index.js): it
// sends the real call on each path in turn and reads these errors. Nothing here sends
// COMMAND, INFO, MODULE or SCRIPT LOAD.

import { readFileSync } from "node:fs";
import { adapt, isConnectionMisconfigured, replyText, sha1 } from "./adapter.js";

const SCRIPT = readFileSync(new URL("./rl.lua", import.meta.url), "utf8");
const SCRIPT_SHA = sha1(SCRIPT);

/** The version of the Functions library redis_rl this client needs (`FCALL_RO rl_version 0`). */
export const FUNCTIONS_VERSION = 5;

/** Where the documentation lists each path's ACL rules. */
const PERMISSIONS = "docs/clients.md#permissions";

/** Base class of this package's own errors. */
export class RateLimitError extends Error {}

/**
 * Redis refused the limiter for a reason no retry cures: a wrong password, a user without the
 * permissions of any path, a cluster client on a standalone server, a single-node client on a
 * cluster, no module under withoutModule "refuse". check() rejects with it; at run time the
 * failure policy decides, the cause is logged at error level and counted in
 * counters.misconfigured (never as an outage). `cause` is the error Redis or the client gave.
 */
export class MisconfiguredError extends RateLimitError {
  constructor(message, options) {
    super(message, options);
    this.name = "MisconfiguredError";
    /** The kind of cause ("auth", "noperm", "cluster-client", "single-node-client", ...):
     * one log line a minute per kind and message text. */
    this.kind = options?.kind ?? "other";
  }
}

/** The server has no RL.ACQUIRE and the limiter was built with withoutModule: "refuse". */
export class ModuleMissingError extends MisconfiguredError {
  constructor(options) {
    super('the server has no RL.ACQUIRE (the redis-rl module is not loaded) and this limiter was built ' +
      'with withoutModule: "refuse"; load the module or use withoutModule: "lua"', options);
    this.name = "ModuleMissingError";
  }
}

/** Whether `error` says the command or function is not there: the path is absent (nothing ran). */
export function isAbsent(error) {
  return /unknown command|^ERR Function not found/i.test(replyText(error));
}

/**
 * Whether `error` is a WRONGTYPE reply: the key holds another type. Matched as a word anywhere
 * in the text, since Redis 7 wraps an error raised inside a script or function ("... script:
 * rl_acquire, on @user_function:94.").
 */
export const isWrongType = (error) => /\bWRONGTYPE\b/.test(replyText(error));

export const isNoScript = (error) => replyText(error).startsWith("NOSCRIPT");

/**
 * The command a top-level NOPERM names ("fcall", "rl.acquire", "function|load"), or null:
 * Redis 7 says "NOPERM this user has no permissions to run the 'fcall' command", Valkey
 * "NOPERM User app has no permissions to run the 'fcall' command".
 */
export function deniedCommand(error) {
  const m = /^NOPERM\b.*?run the '([^']+)' command/i.exec(replyText(error));
  return m ? m[1].toLowerCase() : null;
}

/** The ACL rules to suggest for the first path a user was refused. */
function rulesFor(command) {
  if (command.startsWith("fcall")) return '"+fcall +fcall_ro"';
  if (command === "evalsha" || command === "eval") return '"+evalsha +eval"';
  return `"+${command}"`;
}

/** The error when ACL refused every path: names the commands, the rules to add and the docs. */
export function noPathError(denied) {
  const [first, ...rest] = [...new Set(denied)];
  const nor = rest.length ? ` (nor ${rest.map((c) => `'${c}'`).join(", ")})` : "";
  const other = rest.find((c) => rulesFor(c) !== rulesFor(first));
  return new MisconfiguredError(`NOPERM: this user may not run '${first}'${nor}; add the ACL rules ${rulesFor(first)}` +
    `${other ? ` or ${rulesFor(other)}` : ""} or see ${PERMISSIONS}`);
}

/**
 * The MisconfiguredError that `error` means, or null when it is not a misconfiguration.
 * `cluster`: whether the client is a cluster client (then MOVED and CROSSSLOT are not the
 * client's kind's fault).
 */
export function misconfiguration(error, cluster) {
  if (error instanceof MisconfiguredError) return error;
  const text = replyText(error);
  if (!text) return null;
  const options = { cause: error };
  if (/cluster support disabled/i.test(text)) {
    return new MisconfiguredError("a cluster client on a server without cluster support " +
      `(${text}): use a standalone client (new Redis(), createClient) for it`, options);
  }
  if (isConnectionMisconfigured(error)) {
    return new MisconfiguredError(`authentication failed (${text}): check the user name and password the client ` +
      "was given", options);
  }
  if (!cluster && /^(MOVED|ASK|CROSSSLOT)\b/.test(text)) {
    return new MisconfiguredError("a single-node client on a Redis Cluster (it answers MOVED, ASK or CROSSSLOT): use " +
      "a cluster client (ioredis's Cluster, node-redis's createCluster)", options);
  }
  const denied = deniedCommand(error);
  if (denied) {
    return new MisconfiguredError(`NOPERM: this user may not run '${denied}'; add the ACL rule ${rulesFor(denied)} ` +
      `or see ${PERMISSIONS}`, options);
  }
  if (/^NOPERM\b.*\bkeys?\b/i.test(text)) {
    return new MisconfiguredError(`NOPERM: this user may not use the limiter's keys (${text}); add a key pattern ` +
      `for them (~* or ~<prefix>*) or see ${PERMISSIONS}`, options);
  }
  // Refused inside the script or function: Valkey names the command, Redis 7 does not.
  if (/can't run this command or subcommand|ACL failure in script|^NOPERM\b/i.test(text)) {
    const m = /run the '([^']+)' command/i.exec(text);
    const what = m ? `'${m[1].toLowerCase()}'` : "a command the script runs (time, get, set, hmget, hset, pexpireat, del)";
    return new MisconfiguredError(`NOPERM: the script or function may not run ${what} as this user; add ` +
      `${m ? `"+${m[1].toLowerCase()}"` : '"+time +get +set +hmget +hset +pexpireat +del"'} or see ${PERMISSIONS}`, options);
  }
  return null;
}

/**
 * Runs the script: EVALSHA of the sha1 computed here, and on NOSCRIPT the same call as EVAL,
 * which runs it and caches it on that server (after a SCRIPT FLUSH each caller pays one EVAL
 * at most, and nothing is raised). A user refused EVALSHA gets EVAL from then on; a user
 * refused EVAL still runs a script an admin loaded. Never SCRIPT LOAD. `raw`: bulk strings
 * come back as Buffers (the short form's packed reply; see shortReply).
 */
export async function scriptCall(limiter, args, key, denied = [], raw = false) {
  const { redis } = limiter;
  if (limiter.evalshaDenied) denied.push("evalsha");
  else {
    try {
      return await redis.send(["EVALSHA", SCRIPT_SHA, ...args], key, raw);
    } catch (error) {
      if (deniedCommand(error) === "evalsha") {
        limiter.evalshaDenied = true;
        denied.push("evalsha");
      } else if (!isNoScript(error)) {
        throw error;
      }
    }
  }
  return redis.send(["EVAL", SCRIPT, ...args], key, raw);
}

/**
 * The script's short form and the Functions library's rl_acquire_packed answer an acquire's
 * four numbers (allowed, remaining, retry_after_ms, reset_after_ms) packed: 32 bytes, four
 * little-endian doubles, each a whole number. Anything else is not their reply.
 */
export function shortReply(reply) {
  if (!Buffer.isBuffer(reply) || reply.length !== 32) {
    throw new Error(`redis-rl script: the short form's reply is not 32 bytes: ${String(reply)}`);
  }
  return [0, 8, 16, 24].map((at) => reply.readDoubleLE(at));
}

/** The Functions library's text, read once, when first loaded. */
let functionsText = null;

/** The version a library text declares: the integer its rl_version returns. */
function declaredVersion(text) {
  const m = /^local VERSION = (\d+)$/m.exec(text);
  return m ? Number(m[1]) : null;
}

/**
 * Loads the Functions library redis_rl (the shipped rl_functions.lua) with `FUNCTION LOAD
 * REPLACE`, on the server or on every master of a cluster (ioredis Cluster: its master nodes;
 * node-redis cluster: its masters), and resolves to the version loaded. For an admin (ACL
 * "+function|load +function|list"), once per deploy of a new version; the limiters of
 * unprivileged users then take the Functions path.
 */
export async function loadFunctions(client) {
  const redis = adapt(client);
  functionsText ??= readFileSync(new URL("./rl_functions.lua", import.meta.url), "utf8");
  const version = declaredVersion(functionsText);
  const opening = redis.ready();
  if (opening) await opening;
  const nodes = redis.masters ? await redis.masters() : [(args) => redis.send(args)];
  if (nodes.length === 0) throw new Error("loadFunctions: the cluster client knows no masters yet (is it connected?)");
  for (const send of nodes) await send(["FUNCTION", "LOAD", "REPLACE", functionsText]);
  return version;
}
