// Real redis-server processes for the tests: one per test, on a free loopback port, in a temp
// dir, killed at the end. With the module (RL_MODULE, default target/debug/libredis_rl.so) or
// without it (a plain server: the Functions library or the Lua script), on redis-server
// (REDIS_SERVER) or another binary (Valkey: VALKEY), and small clusters of them.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
export const MODULE = process.env.RL_MODULE || join(ROOT, "target", "debug", "libredis_rl.so");
const SERVER = process.env.REDIS_SERVER || "redis-server";
/** Valkey 9, as `make servers` unpacks it (VALKEY overrides); null when it is not there. */
export const VALKEY = [process.env.VALKEY, join(ROOT, "target", "servers", "bin", "valkey-9.1.2")]
  .find((p) => p && existsSync(p)) ?? null;
/** The servers the path tests run on: redis-server, and Valkey 9 when present. */
export const BINARIES = [["redis", SERVER], ...(VALKEY ? [["valkey 9", VALKEY]] : [])];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function answers(port) {
  return new Promise((resolve) => {
    const sock = connect({ host: "127.0.0.1", port });
    const done = (ok) => { sock.destroy(); resolve(ok); };
    sock.setTimeout(500, () => done(false));
    sock.once("error", () => done(false));
    sock.once("connect", () => sock.write("PING\r\n"));
    // NOAUTH: up, and asking for the password it was started with.
    sock.once("data", (d) => done(/^(\+PONG|-NOAUTH)/.test(d.toString())));
  });
}

export class Server {
  /** `options`: binary (default REDIS_SERVER), args (more server arguments), cluster (cluster-enabled). */
  constructor(module = true, options = {}) {
    this.module = module;
    this.binary = options.binary ?? SERVER;
    this.extraArgs = options.args ?? [];
    this.cluster = options.cluster ?? false; // cluster-enabled, its bus on busPort
    this.busPort = null;
    this.dir = mkdtempSync(join(tmpdir(), "redis-rl-node-"));
    this.port = null;
    this.proc = null;
  }

  static async start(module = true, options = {}) {
    if (module && !existsSync(MODULE)) throw new Error(`no module at ${MODULE}: run cargo build --lib`);
    const s = new Server(module, options);
    await s.start();
    return s;
  }

  async start() {
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = this.port ?? (await freePort());
      const args = ["--port", String(port), "--bind", "127.0.0.1", "--dir", this.dir, "--save", "",
        "--appendonly", "no", "--logfile", "server.log"];
      if (this.module) args.push("--loadmodule", MODULE);
      if (this.cluster) {
        this.busPort ??= await freePort();
        args.push("--cluster-enabled", "yes", "--cluster-port", String(this.busPort), "--cluster-config-file", "nodes.conf",
          "--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0");
      }
      args.push(...this.extraArgs);
      this.proc = spawn(this.binary, args, { stdio: "ignore" });
      let exited = false;
      this.proc.once("exit", () => { exited = true; });
      const end = Date.now() + 10_000;
      while (Date.now() < end && !exited) {
        if (await answers(port)) { this.port = port; return; }
        await sleep(50);
      }
      this.proc.kill("SIGKILL");
      await sleep(200);
    }
    throw new Error(`${this.binary} did not start (log in ${this.dir})`);
  }

  get url() { return `redis://127.0.0.1:${this.port}`; }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      const gone = new Promise((r) => this.proc.once("exit", r));
      this.proc.kill("SIGKILL");
      await gone;
    }
  }

  async close() {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Sends one command on a fresh connection to `port` (as the default user) and gives the reply. */
export async function admin(port, ...args) {
  const Redis = (await import("ioredis")).default;
  const c = new Redis({ port, host: "127.0.0.1", lazyConnect: true, enableReadyCheck: false, maxRetriesPerRequest: 0 });
  try {
    await c.connect();
    return await c.call(args[0], ...args.slice(1));
  } finally {
    c.disconnect();
  }
}

/**
 * A cluster of `masters` masters (the slots split evenly) and `replicas` replicas of the first
 * master, each a Server on free ports; ready (cluster_state:ok everywhere) when it resolves.
 */
export class Cluster {
  constructor(nodes, replicas) {
    this.nodes = nodes;
    this.masters = nodes.slice(0, nodes.length - replicas);
    this.replicas = nodes.slice(nodes.length - replicas);
  }

  static async start({ masters = 3, replicas = 0, module = false, binary, args = [] } = {}) {
    const nodes = [];
    try {
      for (let i = 0; i < masters + replicas; i++) nodes.push(await Server.start(module, { binary, args, cluster: true }));
      const c = new Cluster(nodes, replicas);
      await c.form();
      return c;
    } catch (error) {
      for (const n of nodes) await n.close();
      throw error;
    }
  }

  async form() {
    const per = Math.floor(16384 / this.masters.length);
    for (const [i, m] of this.masters.entries()) {
      const last = i === this.masters.length - 1 ? 16383 : (i + 1) * per - 1;
      await admin(m.port, "CLUSTER", "ADDSLOTSRANGE", String(i * per), String(last));
    }
    for (const n of this.nodes.slice(1)) await admin(n.port, "CLUSTER", "MEET", "127.0.0.1", String(this.nodes[0].port), String(this.nodes[0].busPort));
    const firstId = String(await admin(this.masters[0].port, "CLUSTER", "MYID"));
    const end = Date.now() + 20_000;
    for (const r of this.replicas) {
      for (;;) {
        try {
          await admin(r.port, "CLUSTER", "REPLICATE", firstId);
          break;
        } catch (error) {
          if (Date.now() > end) throw error; // the replica does not know the master yet
          await sleep(100);
        }
      }
    }
    for (const n of this.nodes) {
      while (!/cluster_state:ok/.test(String(await admin(n.port, "CLUSTER", "INFO")))) {
        if (Date.now() > end) throw new Error(`the cluster did not form (node ${n.port})`);
        await sleep(100);
      }
    }
    for (const r of this.replicas) {
      while (!/master_link_status:up/.test(String(await admin(r.port, "INFO", "replication")))) {
        if (Date.now() > end) throw new Error(`the replica ${r.port} did not sync`);
        await sleep(100);
      }
    }
  }

  /** Sends one command to every node as the default user. */
  async everyNode(...args) {
    for (const n of this.nodes) await admin(n.port, ...args);
  }

  async close() {
    for (const n of this.nodes) await n.close();
  }
}

/** How many times `command` reached the server (INFO commandstats). */
export async function calls(client, command) {
  const info = await client.send(["INFO", "commandstats"]);
  const line = String(info).split("\r\n").find((l) => l.toLowerCase().startsWith(`cmdstat_${command.toLowerCase()}:`));
  return line ? Number(/calls=(\d+)/.exec(line)[1]) : 0;
}

/**
 * Runs `body(scope)`: `scope.server(module)` starts a server, `scope.defer(fn)` registers a
 * cleanup; every cleanup runs afterwards, last first, whatever `body` did.
 */
export async function withCleanups(body) {
  const cleanups = [];
  const scope = {
    defer: (fn) => cleanups.push(fn),
    async server(module = true, options = {}) {
      const s = await Server.start(module, options);
      cleanups.push(() => s.close());
      return s;
    },
    async cluster(options) {
      const c = await Cluster.start(options);
      cleanups.push(() => c.close());
      return c;
    },
  };
  try {
    await body(scope);
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}
