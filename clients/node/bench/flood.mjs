// Node side of make bench-clients: floods one denied key through the library on ioredis and
// prints each call's latency in µs as a JSON array. Args: port key calls denyCache(0|1).
import Redis from "ioredis";
import { Limit, Limiter } from "../src/index.js";

const [port, key, calls, denyCache] = process.argv.slice(2);
const client = new Redis({ port: Number(port), host: "127.0.0.1", enableOfflineQueue: false, lazyConnect: true });
await client.connect();
const limiter = new Limiter(client, { onError: "closed", denyCache: denyCache === "1", timeoutMs: 1000 });
const limit = new Limit(0.001, 1);
await limiter.acquire(key, limit);
await limiter.acquire(key, limit);
const times = [];
for (let i = 0; i < Number(calls); i++) {
  const t = process.hrtime.bigint();
  const d = await limiter.acquire(key, limit);
  times.push(Number(process.hrtime.bigint() - t) / 1000);
  if (d.allowed) throw new Error("bench: a flooded call was allowed");
}
client.disconnect();
console.log(JSON.stringify(times));
