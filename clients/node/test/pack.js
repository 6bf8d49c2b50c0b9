// The package as users install it: `npm pack`, the tarball installed with its peer dependency
// (ioredis) in a fresh directory outside the repository, and run there against real servers:
// a smoke script on one with the module and one without (the shipped Lua script), then the
// Node examples (examples/node: the HTTP API and the worker pool, with their own tests) on
// the installed tarball instead of the source tree. Run by `make test-clients-node` (npm run
// test:pack); not a *.test.js, since it installs from npm.
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Server } from "./servers.js";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const EXAMPLES = join(ROOT, "examples", "node");
const EXAMPLE_FILES = ["api.js", "worker-pool.js", "example.test.js"];
// The examples' own dependencies but redis-rl (the tarball stands in for its file: link).
const exampleDeps = Object.entries(JSON.parse(readFileSync(join(EXAMPLES, "package.json"), "utf8")).dependencies)
  .filter(([name]) => name !== "redis-rl").map(([name, range]) => `${name}@${range}`);

const SMOKE = `
import assert from "node:assert/strict";
import Redis from "ioredis";
import { Limit, Limiter, RANGES } from "redis-rl";
import { RedisRlStore, rateLimit } from "redis-rl/middleware";

assert.equal(typeof rateLimit, "function");
assert.equal(typeof RedisRlStore, "function");
assert.equal(RANGES.rate.min, "0.000001"); // the shipped ranges.json was read
for (const [port, source] of [[process.env.RL_PORT, "redis"], [process.env.PLAIN_PORT, "lua"]]) {
  // As the README builds it: no offline queue, and the first call while it still connects.
  const redis = new Redis({ port: Number(port), host: "127.0.0.1", enableOfflineQueue: false });
  const limiter = new Limiter(redis, { onError: "closed" });
  const limit = new Limit(0.1, 2);
  const got = [];
  for (let i = 0; i < 3; i++) got.push(await limiter.acquire("smoke", limit));
  assert.deepEqual(got.map((d) => [d.allowed, d.source]), [[true, source], [true, source], [false, source]]);
  if (source === "redis") {
    // Leases and reservations, from the installed package: released on a throw, settled once.
    await assert.rejects(limiter.withLease("smoke:lease", 1, 10_000, () => { throw new Error("boom"); }), /boom/);
    assert.equal((await limiter.leases("smoke:lease", 1)).inUse, 0);
    const r = await limiter.reserve("smoke:resv", new Limit(0.001, 10), 4, 10_000);
    assert.deepEqual([r.allowed, r.remaining, (await r.settle(1)).remaining], [true, 6, 9]);
  }
  redis.disconnect();
}
console.log("redis-rl smoke: module and Lua paths answered from the installed package");
`;

const run = (cmd, args, cwd, env = {}) => execFileSync(cmd, args, { cwd, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] }).toString();

const dir = mkdtempSync(join(tmpdir(), "redis-rl-pack-"));
if (!relative(ROOT, dir).startsWith("..")) throw new Error(`${dir} is inside the repository`);
const servers = [];
try {
  const tarball = run("npm", ["pack", "--silent", "--pack-destination", dir], PACKAGE).trim().split("\n").at(-1);
  const listing = run("tar", ["-tvzf", join(dir, tarball)], dir);
  for (const file of ["package/src/rl.lua", "package/src/rl_functions.lua", "package/src/ranges.json", "package/src/index.js", "package/src/index.d.ts", "package/src/lease.js"]) {
    const line = listing.split("\n").find((l) => l.endsWith(` ${file}`));
    if (!line || !line.startsWith("-")) throw new Error(`the tarball has no regular file ${file}:\n${listing}`);
  }
  const app = join(dir, "app");
  run("mkdir", [app], dir);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "smoke", private: true, type: "module" }));
  run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", join(dir, tarball), ...exampleDeps], app);
  writeFileSync(join(app, "smoke.mjs"), SMOKE);
  for (const file of EXAMPLE_FILES) copyFileSync(join(EXAMPLES, file), join(app, file));
  servers.push(await Server.start(true), await Server.start(false));
  process.stdout.write(run("node", ["smoke.mjs"], app, { RL_PORT: String(servers[0].port), PLAIN_PORT: String(servers[1].port) }));
  // The examples import "redis-rl" from the app's node_modules: the tarball, nothing else.
  const resolved = run("node", ["--input-type=module", "-e", 'console.log(import.meta.resolve("redis-rl"))'], app).trim();
  if (!resolved.startsWith(pathToFileURL(join(app, "node_modules")).href)) throw new Error(`redis-rl resolved to ${resolved}`);
  process.stdout.write(run("node", ["--test", "--test-reporter=dot", ...EXAMPLE_FILES.filter((f) => f.endsWith(".test.js"))], app,
    { REDIS_URL: `redis://127.0.0.1:${servers[0].port}` }));
  console.log("redis-rl examples: examples/node passed on the installed package");
} finally {
  for (const s of servers) await s.close();
  rmSync(dir, { recursive: true, force: true });
}
