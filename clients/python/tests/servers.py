"""Real redis-server processes for the tests: one per test, on a free loopback port, in a temp
dir, killed at the end. With the module (RL_MODULE, default target/debug/libredis_rl.so) or
without it (a plain server: the Lua path). No mocks of Redis anywhere."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "debug", "libredis_rl.so"))
SERVER = os.environ.get("REDIS_SERVER", "redis-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Server:
    """A redis-server; `stop()` and `start()` again on the same port model an outage."""

    def __init__(self, module=True, extra=(), binary=None):
        if module and not os.path.exists(MODULE):
            raise RuntimeError(f"no module at {MODULE}: run cargo build --lib (or set RL_MODULE)")
        self.module = module
        self.binary = binary or SERVER
        self.extra = list(extra)
        self.dir = tempfile.mkdtemp(prefix="redis-rl-client-")
        self.port = None
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self):
        for _ in range(5):
            port = self.port or free_port()
            args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", self.dir,
                    "--save", "", "--appendonly", "no", "--logfile", "server.log", *self.extra]
            if self.module:
                args += ["--loadmodule", MODULE]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _answers(port):
                    self.port = port
                    return
                time.sleep(0.05)
            self.proc.kill()
            self.proc.wait()
            if self.port:  # a restart on the same port: the old socket may linger briefly
                time.sleep(0.2)
        with open(os.path.join(self.dir, "server.log")) as f:
            raise RuntimeError(f"{self.binary} did not start:\n{f.read()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def calls(self, command):
        """How many times `command` reached the server (INFO commandstats)."""
        import redis

        with redis.Redis(port=self.port) as admin:
            stats = admin.info("commandstats")
        # Module commands keep their case (cmdstat_RL.ACQUIRE), built-ins are lower case.
        return sum(v.get("calls", 0) for k, v in stats.items() if k.lower() == f"cmdstat_{command.lower()}")

    def admin(self):
        """A client of the default user (all permissions)."""
        import redis

        return redis.Redis(port=self.port)


#: Valkey 9 (make servers unpacks it into target/servers), or a valkey-server on PATH.
VALKEY = next((path for path in (os.environ.get("RL_VALKEY"),
                                 os.path.join(ROOT, "target", "servers", "bin", "valkey-9.1.2"),
                                 shutil.which("valkey-server")) if path and os.path.exists(path)), None)


class Cluster:
    """A Redis Cluster of `masters` servers (no replicas) on free ports, the slots split evenly,
    built with CLUSTER MEET and ADDSLOTSRANGE and waited for until every node says ok."""

    def __init__(self, masters=2, module=True, binary=None, extra=()):
        import redis

        self.servers = []
        try:
            for _ in range(masters):
                self.servers.append(Server(module=module, binary=binary,
                                           extra=["--cluster-enabled", "yes", "--cluster-config-file",
                                                  "nodes.conf", *extra]))
            admins = [s.admin() for s in self.servers]
            step = 16384 // masters
            for i, admin in enumerate(admins):
                last = 16383 if i == masters - 1 else (i + 1) * step - 1
                admin.execute_command("CLUSTER ADDSLOTSRANGE", i * step, last)
                if i:
                    admin.execute_command("CLUSTER MEET", "127.0.0.1", self.servers[0].port)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                infos = [a.cluster("INFO") for a in admins]
                if all(i["cluster_state"] == "ok" and int(i["cluster_known_nodes"]) == masters
                       for i in infos):
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the cluster did not become ok")
            for admin in admins:
                admin.close()
        except BaseException:
            self.close()
            raise

    @property
    def port(self):
        return self.servers[0].port

    def close(self):
        for s in self.servers:
            s.close()

    def calls(self, command):
        return sum(s.calls(command) for s in self.servers)
