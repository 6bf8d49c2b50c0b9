// Types for redis-rl's HTTP middleware (src/middleware.js).
import type { IncomingMessage, ServerResponse } from "node:http";
import type { BlockList } from "node:net";
import type { Decision, Lease, Limit, Limiter } from "./index.js";

/** "draft-ietf-httpapi-ratelimit-headers-10": the RateLimit-Policy / RateLimit syntax written. */
export const HEADERS_DRAFT: string;
export const PROBLEM_TYPE: "application/problem+json";

export interface RateLimitOptions<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse> {
  limiter: Limiter;
  /** A Limit, or one per request (per-user tiers), sync or async. */
  /** May be left out when `inFlight` is given (an in-flight limit alone). */
  limit?: Limit | ((req: Req) => Limit | Promise<Limit>);
  /** An in-flight limit per key: after the rate limit allowed the request, a lease taken
   * before the handler, released once when the response is sent or its connection closes (a
   * client that went, a stream cut short), renewed every ttlMs / 2 meanwhile (default ttlMs
   * 60000). A number is the limit, a pair [limit, ttlMs]. Default prefix
   * "rl:http:inflight:<limit>:", or `prefix` followed by "inflight:". */
  inFlight?: number | [limit: number, ttlMs: number] | { limit: number; ttlMs?: number; renew?: boolean; prefix?: string };
  /** "ip" (default), "header:<Name>", or a function of the request, sync or async. */
  key?: "ip" | `header:${string}` | ((req: Req) => string | null | undefined | Promise<string | null | undefined>);
  /** Tokens per request (default 1). */
  cost?: number | ((req: Req) => number | Promise<number>);
  /** Addresses or networks ("10.0.0.0/8") whose X-Forwarded-For is believed. */
  trustedProxies?: string[];
  /** Before each key in Redis. Default: the limit's own key space, "rl:http:<rate>:<capacity>:";
   * two middlewares on one Redis key for a request are refused with an error naming it. */
  prefix?: string;
  /** The name in RateLimit-Policy / RateLimit. Default "default". */
  policyName?: string;
  /** Also write X-RateLimit-Limit/-Remaining/-Reset. Default true. */
  legacyHeaders?: boolean;
  /** True lets a request through untouched (health checks). */
  skip?: (req: Req) => boolean | Promise<boolean>;
  /** Sends a custom response instead of the problem+json 429. */
  /** Given the Decision of a rate limit's denial, or the denied Lease of the in-flight limit's. */
  onLimited?: (req: Req, res: Res, decision: Decision | Lease, headers: [string, string][]) => unknown | Promise<unknown>;
}

/** Connect/Express middleware. */
export function rateLimit<Req extends IncomingMessage = IncomingMessage, Res extends ServerResponse = ServerResponse>(
  options: RateLimitOptions<Req, Res>,
): (req: Req, res: Res, next: (error?: unknown) => void) => Promise<void>;

/**
 * Runs `middleware` (an express-rate-limit middleware) with its request in reach of its
 * RedisRlStore, so that a `limit(req, res)` function is honoured: the store calls it, with the
 * request being served, before it takes from the bucket of that limit.
 */
export function withRequest<M extends (req: any, res: any, next: any) => unknown>(middleware: M): M;

/** The start of the in-flight limit's default lease keys: "rl:http:inflight:<limit>:". */
export const DEFAULT_IN_FLIGHT_PREFIX: "rl:http:inflight:";
/** The start of rateLimit's default key spaces: "rl:http:<rate>:<capacity>:". */
export const DEFAULT_PREFIX: "rl:http:";

export function clientAddress(peer: string | undefined, forwardedFor: string | undefined, trusted: BlockList): string;
/** Logged once when a store whose express-rate-limit limit is a function of the request was
 * built without withRequest: it then counts hits in fixed windows of windowMs, and
 * express-rate-limit compares them with limit(req, res). */
export const UNWRAPPED_WARNING: string;
export function headerFields(decision: Decision, options?: { policyName?: string; legacyHeaders?: boolean }): [string, string][];
/** One set of fields for several limits' decisions on one request: the draft's lists, X-RateLimit-* of the tightest. */
export function mergedHeaderFields(decided: [{ policyName?: string; legacyHeaders?: boolean }, Decision][]): [string, string][];
export function problem(decision: Decision): { type: string; title: string; status: 429; detail: string };

/**
 * A Store for express-rate-limit: limit per windowMs as one token bucket per key. `decrement`
 * gives back only what the same request's increment took; totalHits is a positive integer
 * under every failure policy; the default prefix is "rl:erl:<limit>/<windowMs>ms:", one key
 * space per limiter, and two limiters sharing a Redis key in one request are refused.
 */
export class RedisRlStore {
  /**
   * `limit`: the limit of a key (sync or async), the same tiers by key, for express-rate-limit's
   * `limit` given as a function of the request when the middleware is not wrapped in
   * `withRequest` (with the wrapper, the store calls express-rate-limit's `limit(req, res)`;
   * with neither, it counts hits per fixed window of windowMs, "rl:erl:window/...").
   */
  constructor(options: { limiter: Limiter; prefix?: string; limit?: (key: string) => number | Promise<number> });
  readonly localKeys: false;
  readonly prefix: string;
  init(options: { limit: unknown; windowMs: number }): void;
  increment(key: string): Promise<{ totalHits: number; resetTime: Date }>;
  get(key: string): Promise<{ totalHits: number; resetTime: Date }>;
  decrement(key: string): Promise<void>;
  resetKey(key: string): Promise<void>;
}
