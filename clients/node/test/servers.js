// Real redis-server processes for the tests: one per test, on a free loopback port, in a temp
// dir, killed at the end. With the module (RL_MODULE, default target/debug/libredis_rl.so) or
// without it (a plain server: the Lua path).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));
export const MODULE = process.env.RL_MODULE || join(ROOT, "target", "debug", "libredis_rl.so");
const SERVER = process.env.REDIS_SERVER || "redis-server";
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
    sock.once("data", (d) => done(d.toString().startsWith("+PONG")));
  });
}

export class Server {
  constructor(module = true) {
    this.module = module;
    this.dir = mkdtempSync(join(tmpdir(), "redis-rl-node-"));
    this.port = null;
    this.proc = null;
  }

  static async start(module = true) {
    if (module && !existsSync(MODULE)) throw new Error(`no module at ${MODULE}: run cargo build --lib`);
    const s = new Server(module);
    await s.start();
    return s;
  }

  async start() {
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = this.port ?? (await freePort());
      const args = ["--port", String(port), "--bind", "127.0.0.1", "--dir", this.dir, "--save", "",
        "--appendonly", "no", "--logfile", "server.log"];
      if (this.module) args.push("--loadmodule", MODULE);
      this.proc = spawn(SERVER, args, { stdio: "ignore" });
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
    throw new Error(`${SERVER} did not start (log in ${this.dir})`);
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
    async server(module = true) {
      const s = await Server.start(module);
      cleanups.push(() => s.close());
      return s;
    },
  };
  try {
    await body(scope);
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}
