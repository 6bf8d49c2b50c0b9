"""The three paths (the module, the Functions library, the script), found without privileges,
on Redis 7.0 and Valkey 9, standalone and on a cluster: under an admin, under the
least-privilege rules of clients/vectors/permissions.json, with COMMAND renamed away (on a
cluster redis-py's own client needs it: that is named as the cause), without SCRIPT LOAD, and
with FCALL only. Each counts the commands that reached the server (INFO
commandstats): nothing privileged is sent, SCRIPT LOAD never. Then misconfigurations (a wrong
password, a missing permission, a cluster client on one server and a plain client on a
cluster): raised by check(), decided by the policy and counted at run time.

Each test starts its own servers (servers.py). Valkey runs when make servers has unpacked it
(target/servers/bin/valkey-9.1.2) or valkey-server is on PATH; otherwise its tests skip."""

import asyncio
import json
import os
import time
import unittest

import redis
import redis.asyncio

import redis_rl
from redis_rl import Limit, Limiter, MisconfiguredError, SlotItem
from redis_rl import asyncio as rl_asyncio
from servers import MODULE, ROOT, VALKEY, Cluster, Server

with open(os.path.join(ROOT, "clients", "vectors", "permissions.json")) as f:
    RULES = json.load(f)
with open(os.path.join(ROOT, "clients", "lua", "rl.lua")) as f:
    SCRIPT = f.read()
# Slow enough that no refill happens while a test runs.
SLOW = Limit(0.001, 3)
SOURCE = {"module": "redis", "functions": "functions", "lua": "lua"}
# What detection must never send (docs/clients.md#servers-without-the-module-three-paths);
# INFO too, which the count itself sends, so a least-privilege user (no INFO) shows that one.
PRIVILEGED = ("command", "command|info", "command|docs", "command|getkeys", "module|list",
              "script|load", "function|list")
# Between one caller's calls in the SCRIPT FLUSH and failover test: 8 rounds last over 1 s.
PAUSE_S = 0.15


def next_millisecond():
    """Lets the server's clock pass the millisecond of the last fallback write. On Redis 7.0
    the module reads the time in whole milliseconds and the fallback in microseconds (TIME):
    within the millisecond of a fallback write, the module sees the bucket up to 1 ms emptier
    (stricter, never laxer), which at a whole count of tokens is one less."""
    time.sleep(0.002)


def rules(path, cluster=False, part="decide"):
    """The ACL rules of a user of `path`, from permissions.json."""
    words = list(RULES["connection"])
    if cluster:
        words += RULES["cluster"]
    return words + RULES["paths"][path][part]


def add_user(admin, words, name="app", password="pw"):
    admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", "~*",
                          "resetchannels", "-@all", *words)


def sequence(limiter, prefix):
    """One fixed run of every call: four takes of a bucket of 3, a peek, a refund, a take, a
    charge into debt and a peek of it, all or nothing twice over one hash tag."""
    out = [(d.allowed, d.remaining, d.source) for d in (limiter.acquire(prefix + "a", SLOW) for _ in range(4))]
    out.append(("peek", limiter.peek(prefix + "a", SLOW).remaining))
    out.append(("refund", limiter.refund(prefix + "a", SLOW).remaining))
    out.append(("take", limiter.acquire(prefix + "a", SLOW).remaining))
    charge = limiter.charge(prefix + "c", SLOW, 5)
    out.append(("charge", charge.applied, charge.remaining))
    out.append(("debt", limiter.peek(prefix + "c", SLOW, 0).remaining))
    items = [("{" + prefix + "}s", SLOW, 2), ("{" + prefix + "}h", Limit(0.001, 1), 1)]
    for _ in range(2):
        m = limiter.acquire_all(items)
        out.append(("all", m.allowed, m.refused_index))
    return out


def expected(source):
    return [(True, 2, source), (True, 1, source), (True, 0, source), (False, 0, source),
            ("peek", 0), ("refund", 1), ("take", 0), ("charge", True, -2), ("debt", -2),
            ("all", True, -1), ("all", False, 0)]


class Paths(unittest.TestCase):
    binary = None

    def setUp(self):
        if self.binary is False:
            self.skipTest("no Valkey 9: make servers, or valkey-server on PATH")

    def server(self, path, extra=()):
        s = Server(module=(path == "module"), binary=self.binary, extra=extra)
        self.addCleanup(s.close)
        if path == "functions":
            with s.admin() as admin:
                self.assertEqual(redis_rl.load_functions(admin), redis_rl.FUNCTIONS_VERSION)
        return s

    def limiter(self, port, client_kwargs=None, **kwargs):
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 2000)
        client = redis.Redis(port=port, **(client_kwargs or {}))
        self.addCleanup(client.close)
        limiter = Limiter(client, **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def run_path(self, s, path, user=None, expect_calls=None):
        kwargs = {"username": user[0], "password": user[1]} if user else None
        limiter = self.limiter(s.port, kwargs)
        self.assertEqual(limiter.check(), path)
        self.assertEqual(limiter.path, path)
        before = {c: s.calls(c) for c in PRIVILEGED}
        self.assertEqual(sequence(limiter, "s"), expected(SOURCE[path]))
        counters = limiter.counters
        self.assertEqual(counters[SOURCE[path]], 11)
        self.assertEqual((counters["misconfigured"], counters["outages"], counters["closed"]), (0, 0, 0))
        for command in PRIVILEGED:
            self.assertEqual(s.calls(command), before[command], command)
        for command, calls in (expect_calls or {}).items():
            self.assertEqual(s.calls(command), calls, command)
        return limiter

    # (a) an admin -------------------------------------------------------------------------

    def test_admin_takes_the_module_then_the_functions_then_the_script(self):
        self.run_path(self.server("module"), "module", expect_calls={"fcall": 0, "evalsha": 0})
        # check() peeks (FCALL_RO), checks the library's version once (FCALL_RO) and sends
        # rl_multi over two slots at cost 0; the run sends 9 FCALL and 2 FCALL_RO.
        self.run_path(self.server("functions"), "functions",
                      expect_calls={"fcall": 10, "fcall_ro": 4, "evalsha": 0, "eval": 0})
        # The script: EVALSHA meets NOSCRIPT once (check's peek), which EVAL answers.
        self.run_path(self.server("lua"), "lua", expect_calls={"eval": 1, "fcall": 0})

    # (b) the least-privilege rules ----------------------------------------------------------

    def test_least_privilege_rules_suffice_on_each_path(self):
        for path, rule_set in (("module", "module"), ("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                s = self.server(path)
                with s.admin() as admin:
                    add_user(admin, rules(rule_set))
                self.run_path(s, path, user=("app", "pw"))

    def test_a_peek_only_user_peeks_on_each_path(self):
        for path, rule_set in (("module", "module"), ("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                s = self.server(path)
                with s.admin() as admin:
                    add_user(admin, rules(rule_set, part="peek"))
                limiter = self.limiter(s.port, {"username": "app", "password": "pw"})
                self.assertEqual(limiter.check(), path)
                d = limiter.peek("k", SLOW)
                self.assertEqual((d.allowed, d.remaining, d.source), (True, 3, SOURCE[path]))

    def test_least_privilege_rules_suffice_for_leases_and_reservations(self):
        # Sent as each path sends them: the module's commands, FCALL, and the script by EVAL
        # (what EVALSHA falls to on NOSCRIPT). A rule missing from permissions.json is NOPERM.
        for path, rule_set in (("module", "module"), ("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                s = self.server(path)
                with s.admin() as admin:
                    add_user(admin, rules(rule_set, part="leases"), name="leaser")
                    add_user(admin, rules(rule_set) + RULES["paths"][rule_set]["reservations"],
                             name="reserver")

                def call(con, mode, key, module, args, read_only=False):
                    if path == "module":
                        return con.execute_command(module[0], key, *module[1:])
                    if path == "functions":
                        return (con.fcall_ro if read_only else con.fcall)(f"rl_{mode}", 1, key, *args)
                    return con.eval(SCRIPT, 1, key, mode, *args)

                leaser = redis.Redis(port=s.port, username="leaser", password="pw")
                self.addCleanup(leaser.close)
                got = call(leaser, "lease", "L", ["RL.LEASE", 1, 60000, "ID", "w"], [1, 60000, "w"])
                self.assertEqual(got, [1, b"w", 1, 60000])
                self.assertEqual(call(leaser, "leases", "L", ["RL.LEASES", 1], [1], True)[0], 1)
                self.assertEqual(call(leaser, "renew", "L", ["RL.RENEW", "w", 1000], ["w", 1000]), 1)
                self.assertEqual(call(leaser, "release", "L", ["RL.RELEASE", "w"], ["w"]), 1)
                reserver = redis.Redis(port=s.port, username="reserver", password="pw")
                self.addCleanup(reserver.close)
                got = call(reserver, "reserve", "B", ["RL.RESERVE", *SLOW.args(), 2, 60000, "ID", "r"],
                           [*SLOW.script_args(2), 60000, "r"])
                self.assertEqual(got, [1, b"r", 1, 0])
                got = call(reserver, "settle", "B", ["RL.SETTLE", *SLOW.args(), "r", 1], [*SLOW.script_args(1), "r"])
                self.assertEqual(got[0], 2)
                if path == "module":
                    # A table's field: the module path's own commands, which the rules name too.
                    got = reserver.execute_command("RL.HRESERVE", "T", "f", *SLOW.args(), 2, 60000, "ID", "r")
                    self.assertEqual(got, [1, b"r", 1, 0])
                    got = reserver.execute_command("RL.HSETTLE", "T", "f", *SLOW.args(), "r", 1)
                    self.assertEqual(got[0], 2)

    # (c) COMMAND renamed away ---------------------------------------------------------------

    def test_command_renamed_away_changes_nothing(self):
        for path in ("module", "functions", "lua"):
            with self.subTest(path):
                self.run_path(self.server(path, extra=["--rename-command", "COMMAND", ""]), path)

    # (d) no SCRIPT LOAD ---------------------------------------------------------------------

    def test_without_script_load_the_script_goes_as_evalsha_and_eval(self):
        s = self.server("lua")
        with s.admin() as admin:
            add_user(admin, ["+@all", "-script|load"])
            admin.script_load(SCRIPT)
        limiter = self.run_path(s, "lua", user=("app", "pw"), expect_calls={"script|load": 1, "eval": 0})
        # After a SCRIPT FLUSH each call caught by it costs one EVAL, and no error.
        with s.admin() as admin:
            admin.script_flush()
        self.assertEqual(limiter.acquire("after", SLOW).remaining, 2)
        self.assertEqual((s.calls("eval"), s.calls("script|load")), (1, 1))
        self.assertEqual(limiter.acquire("after", SLOW).remaining, 1)
        self.assertEqual(s.calls("eval"), 1)

    def test_evalsha_alone_works_while_an_admin_keeps_the_script_loaded(self):
        s = self.server("lua")
        with s.admin() as admin:
            add_user(admin, rules("script_preloaded"))
            admin.script_load(SCRIPT)
        self.run_path(s, "lua", user=("app", "pw"), expect_calls={"eval": 0})

    # (e) FCALL only -------------------------------------------------------------------------

    def test_fcall_only_takes_the_functions_library(self):
        s = self.server("functions")
        with s.admin() as admin:
            add_user(admin, rules("functions"))
        self.run_path(s, "functions", user=("app", "pw"), expect_calls={"evalsha": 0, "eval": 0})

    def test_functions_missing_or_old_fall_back_to_the_script(self):
        s = self.server("lua")
        limiter = self.limiter(s.port)
        self.assertEqual(limiter.acquire("k", SLOW).source, "lua")
        # Loaded later: a limiter that has found the script keeps it; a new one finds the library.
        with s.admin() as admin:
            redis_rl.load_functions(admin)
            self.assertEqual(limiter.acquire("k", SLOW).source, "lua")
            fresh = self.limiter(s.port)
            self.assertEqual(fresh.acquire("k", SLOW).source, "functions")
            # A FUNCTION FLUSH: the library's calls meet "Function not found", the script answers.
            admin.function_flush()
            self.assertEqual((fresh.acquire("k", SLOW).remaining, fresh.path), (0, "lua"))
            # An older library (version 0, no rl_version): logged, and the script is used.
            text = redis_rl.client.functions_text()
            old = text.replace("redis.register_function{function_name = 'rl_version'",
                               "local _ = {function_name = 'rl_version'")
            self.assertNotEqual(old, text)
            admin.execute_command("FUNCTION", "LOAD", "REPLACE", old)
        stale = self.limiter(s.port)
        with self.assertLogs("redis_rl", "ERROR") as logs:
            self.assertEqual(stale.check(), "lua")
        self.assertIn(f"version 0, this client needs version {redis_rl.FUNCTIONS_VERSION}", logs.output[0])

    # The module loaded while a limiter runs the fallback ------------------------------------

    def loaded_later(self, path):
        """A server without the module that can load it at run time (MODULE LOAD), with the
        Functions library loaded for the "functions" path."""
        if not os.path.exists(MODULE):
            self.skipTest("no module build")
        return self.server(path, extra=["--enable-module-command", "yes"])

    def test_a_fallback_limiter_moves_to_the_module_loaded_later(self):
        for path in ("functions", "lua"):
            with self.subTest(path):
                s = self.loaded_later(path)
                old = self.limiter(s.port)
                # A second limiter that also chose the fallback before the module came.
                other = self.limiter(s.port)
                started = time.monotonic()
                d = old.acquire("k", SLOW)
                self.assertEqual((d.allowed, d.remaining, d.source), (True, 2, SOURCE[path]))
                self.assertEqual(other.acquire("o", SLOW).source, SOURCE[path])
                # A key of another type, without the module: WRONGTYPE, as before.
                with s.admin() as admin:
                    admin.set("plain", "x")
                with self.assertRaisesRegex(redis.exceptions.ResponseError, "WRONGTYPE"):
                    old.acquire("plain", SLOW)
                self.assertEqual(old.path, path)
                with s.admin() as admin:
                    admin.execute_command("MODULE", "LOAD", MODULE)
                    next_millisecond()
                    # A process started now takes the module and converts the bucket.
                    new = self.limiter(s.port)
                    self.assertEqual(new.check(), "module")
                    d = new.acquire("k", SLOW)
                    self.assertEqual((d.allowed, d.remaining, d.source), (True, 1, "redis"))
                    self.assertEqual(admin.type("k"), b"rl-bucket")
                fallback_calls = s.calls("fcall") + s.calls("evalsha") + s.calls("eval")
                module_calls = s.calls("RL.ACQUIRE")
                # The old limiter's fallback meets the converted key, finds the module, and
                # the module answers this call: no error.
                with self.assertLogs("redis_rl", "INFO") as logs:
                    d = old.acquire("k", SLOW)
                self.assertEqual((d.allowed, d.remaining, d.source), (True, 0, "redis"))
                self.assertEqual(old.path, "module")
                self.assertIn("using the module path", logs.output[0])
                d = old.acquire("k", SLOW)
                elapsed_ms = (time.monotonic() - started) * 1000
                self.assertEqual((d.allowed, d.remaining, d.source), (False, 0, "redis"))
                # Three takes of 1000 s each since the first: the bucket is full 3000 s after
                # it, and one token comes 1000 s before that, to the millisecond.
                self.assertLessEqual(d.reset_after_ms, 3_000_000)
                self.assertGreater(d.reset_after_ms, 3_000_000 - elapsed_ms - 1)
                self.assertEqual(d.retry_after_ms, d.reset_after_ms - 2_000_000)
                # One fallback call met WRONGTYPE, then one module call per take.
                self.assertEqual(s.calls("fcall") + s.calls("evalsha") + s.calls("eval"),
                                 fallback_calls + 1)
                self.assertEqual(s.calls("RL.ACQUIRE"), module_calls + 2)
                counters = old.counters
                self.assertEqual((counters["redis"], counters["closed"], counters["outages"],
                                  counters["misconfigured"]), (2, 0, 0, 0))
                # A key of another type still raises WRONGTYPE, now from the module; and on a
                # limiter still on the fallback, the one module call finds the module there.
                for limiter in (old, other):
                    module_calls = s.calls("RL.ACQUIRE")
                    with self.assertRaisesRegex(redis.exceptions.ResponseError, "WRONGTYPE"):
                        limiter.acquire("plain", SLOW)
                    self.assertEqual(s.calls("RL.ACQUIRE"), module_calls + 1)
                    self.assertEqual(limiter.path, "module")
                    self.assertEqual((limiter.counters["closed"], limiter.counters["outages"],
                                      limiter.counters["misconfigured"]), (0, 0, 0))
                with s.admin() as admin:
                    self.assertEqual(admin.get("plain"), b"x")

    def test_a_plain_key_on_the_fallback_still_raises_wrongtype(self):
        for path in ("functions", "lua"):
            with self.subTest(path):
                s = self.server(path)
                limiter = self.limiter(s.port, on_error="open")
                self.assertEqual(limiter.check(), path)
                with s.admin() as admin:
                    admin.set("plain", "x")
                    admin.rpush("queue", "x")
                    # Someone else's hash, without the bucket's fields: not a bucket.
                    admin.hset("profile", mapping={"name": "x", "r:1": "y"})
                for key in ("plain", "queue", "profile"):
                    for _ in range(2):
                        with self.assertRaisesRegex(redis.exceptions.ResponseError, "WRONGTYPE"):
                            limiter.acquire(key, SLOW)
                    with self.assertRaisesRegex(redis.exceptions.ResponseError, "WRONGTYPE"):
                        limiter.refund(key, SLOW)
                with s.admin() as admin:
                    self.assertEqual(admin.hgetall("profile"), {b"name": b"x", b"r:1": b"y"})
                    self.assertEqual(admin.get("plain"), b"x")
                self.assertEqual(limiter.path, path)
                counters = limiter.counters
                self.assertEqual((counters["open"], counters["outages"], counters["misconfigured"]),
                                 (0, 0, 0))

    def test_a_user_without_the_module_rules_keeps_the_script_and_its_wrongtype(self):
        s = self.server("module")
        with s.admin() as admin:
            add_user(admin, rules("script"))
            # A user allowed the module converts the bucket the script wrote.
            limiter = self.limiter(s.port, {"username": "app", "password": "pw"}, on_error="open")
            self.assertEqual(limiter.check(), "lua")
            self.assertEqual(limiter.acquire("k", SLOW).remaining, 2)
            next_millisecond()
            self.assertEqual(admin.execute_command("RL.ACQUIRE", "k", *SLOW.args())[1], 1)
        # The module is there but this user may not run it: the script's WRONGTYPE, as it came.
        with self.assertRaisesRegex(redis.exceptions.ResponseError, "WRONGTYPE.*script"):
            limiter.acquire("k", SLOW)
        self.assertEqual(limiter.path, "lua")
        counters = limiter.counters
        self.assertEqual((counters["open"], counters["outages"], counters["misconfigured"]), (0, 0, 0))

    def test_asyncio_fallback_moves_to_the_module_loaded_later(self):
        s = self.loaded_later("lua")
        items = [("{t}a", SLOW), ("{t}b", SLOW, 2)]

        async def run():
            client = redis.asyncio.Redis(port=s.port)
            try:
                limiter = rl_asyncio.Limiter(client, on_error="closed")
                first = await limiter.acquire_all(items)
                with s.admin() as admin:
                    admin.execute_command("MODULE", "LOAD", MODULE)
                    next_millisecond()
                    # Another process converts one of the two buckets.
                    d = self.limiter(s.port).acquire("{t}a", SLOW)
                    self.assertEqual((d.remaining, d.source, admin.type("{t}a")), (1, "redis", b"rl-bucket"))
                with self.assertLogs("redis_rl", "INFO") as logs:
                    second = await limiter.acquire_all(items)
                self.assertIn("using the module path", logs.output[0])
                plain = await limiter.acquire("{t}c", SLOW)
                return first, second, plain, limiter.path, limiter.counters
            finally:
                await client.aclose()

        first, second, plain, path, counters = asyncio.run(run())
        self.assertEqual((first.allowed, first.source, [d.remaining for d in first.decisions]),
                         (True, "lua", [2, 1]))
        # All or nothing over a module bucket and a fallback one, on the module.
        self.assertEqual((second.allowed, second.source, [d.remaining for d in second.decisions]),
                         (False, "redis", [0, 1]))
        self.assertEqual(second.refused_index, 1)
        self.assertEqual((plain.source, path), ("redis", "module"))
        self.assertEqual((counters["lua"], counters["redis"], counters["closed"]), (1, 2, 0))

    def test_across_slots_on_one_server_is_one_atomic_call(self):
        for path in ("module", "functions", "lua"):
            with self.subTest(path):
                s = self.server(path)
                limiter = self.limiter(s.port)
                taken = limiter.acquire_across_slots([("a", SLOW, 2), ("b", SLOW)])
                self.assertEqual((taken.allowed, [o.kind for o in taken.outcomes], taken.sources),
                                 (True, ["taken", "taken"], (SOURCE[path],)))
                self.assertEqual([o.decision.remaining for o in taken.outcomes], [1, 2])
                # "a" holds 1: the call refuses and takes nothing, in one all-or-nothing call.
                refused = limiter.acquire_across_slots([SlotItem("b", SLOW), SlotItem("a", SLOW, 2)])
                self.assertEqual([o.kind for o in refused.outcomes], ["not_taken", "refused"])
                self.assertGreater(refused.retry_after_ms, 0)
                # A shadow item's refusal refuses nothing: the others are asked again without it.
                shadowed = limiter.acquire_across_slots([SlotItem("b", SLOW),
                                                         SlotItem("a", SLOW, 2, shadow=True)])
                self.assertEqual((shadowed.allowed, [o.kind for o in shadowed.outcomes],
                                  len(shadowed.sources)), (True, ["taken", "shadow_refused"], 2))
                self.assertEqual([limiter.peek(k, SLOW, 0).remaining for k in ("a", "b")], [1, 1])

    # Concurrent callers through SCRIPT FLUSH and a failover ---------------------------------

    def test_200_threads_through_script_flushes_and_a_failover(self):
        self.flush_and_failover(threads=True)

    def test_200_tasks_through_script_flushes_and_a_failover(self):
        self.flush_and_failover(threads=False)

    def flush_and_failover(self, threads):
        import threading
        import time

        # No wait before the replica's first sync (diskless sync waits 5 s for more replicas).
        master = self.server("lua", extra=["--repl-diskless-sync-delay", "0"])
        replica = Server(module=False, binary=self.binary,
                         extra=["--replicaof", "127.0.0.1", str(master.port)])
        self.addCleanup(replica.close)
        callers, rounds = 200, 8
        limit = Limit(0.001, callers * rounds)
        stop = threading.Event()
        errors = []
        with replica.admin() as admin:
            for _ in range(100):
                if admin.info("replication").get("master_link_status") == "up":
                    break
                time.sleep(0.05)

        out = []

        def admin_work():
            try:
                # Once every caller has had an answer: the flushes, and the failover after two.
                while len(out) < callers and not stop.wait(0.01):
                    pass
                with master.admin() as admin, replica.admin() as other:
                    flushes = 0
                    while not stop.wait(0.2):
                        for a in (admin, other):
                            if a.info("replication")["role"] == "master":
                                a.script_flush()
                        flushes += 1
                        if flushes == 2:
                            # The master hands over to its replica (Redis's FAILOVER).
                            admin.execute_command("FAILOVER", "TO", "127.0.0.1", replica.port)
            except Exception as error:  # noqa: BLE001 - any error fails the test
                errors.append(error)

        worker = threading.Thread(target=admin_work)
        worker.start()
        try:
            if threads:
                limiter = self.limiter(master.port, on_error="closed", timeout_ms=5000)

                def caller():
                    try:
                        for _ in range(rounds):
                            out.append(limiter.acquire("herd", limit))
                            time.sleep(PAUSE_S)
                    except Exception as error:  # noqa: BLE001 - any error fails the test
                        errors.append(error)

                pool = [threading.Thread(target=caller) for _ in range(callers)]
                for t in pool:
                    t.start()
                for t in pool:
                    t.join()
            else:
                limiter = asyncio.run(self.tasks(master.port, callers, rounds, limit, out))
        finally:
            stop.set()
            worker.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(out), callers * rounds)
        sources = {d.source for d in out}
        self.assertLessEqual(sources, {"lua", "closed"})
        self.assertEqual(limiter.counters["misconfigured"], 0)
        self.assertEqual(master.calls("script|load") + replica.calls("script|load"), 0)
        # Every take the script allowed is in the bucket of the server that is master now.
        allowed = sum(1 for d in out if d.allowed)
        self.assertGreater(allowed, 0)
        with replica.admin() as admin:
            for _ in range(100):
                if admin.info("replication")["role"] == "master":
                    break
                time.sleep(0.05)
            self.assertEqual(admin.info("replication")["role"], "master")
        now = self.limiter(replica.port)
        self.assertEqual(now.peek("herd", limit, 0).remaining, callers * rounds - allowed)

    async def tasks(self, port, callers, rounds, limit, out):
        client = redis.asyncio.Redis(port=port)
        try:
            limiter = rl_asyncio.Limiter(client, on_error="closed", timeout_ms=5000)

            async def caller():
                for _ in range(rounds):
                    out.append(await limiter.acquire("herd", limit))
                    await asyncio.sleep(PAUSE_S)

            await asyncio.gather(*(caller() for _ in range(callers)))
            return limiter
        finally:
            await client.aclose()

    # Misconfigurations ----------------------------------------------------------------------

    def test_a_wrong_password_is_raised_by_check_and_counted_at_run_time(self):
        s = self.server("lua")
        with s.admin() as admin:
            add_user(admin, rules("script"))
        limiter = self.limiter(s.port, {"username": "app", "password": "wrong"}, on_error="open")
        with self.assertRaisesRegex(MisconfiguredError, "authentication failed: .*(WRONGPASS|invalid)"):
            limiter.check()
        with self.assertLogs("redis_rl", "ERROR") as logs:
            d = limiter.acquire("k", SLOW)
        self.assertEqual((d.allowed, d.source), (True, "open"))
        self.assertIn("authentication failed", logs.output[0])
        self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (1, 0))

    def test_a_missing_permission_names_the_command_and_the_rule(self):
        s = self.server("lua")
        with s.admin() as admin:
            add_user(admin, RULES["connection"])
        limiter = self.limiter(s.port, {"username": "app", "password": "pw"}, on_error="open")
        with self.assertRaises(MisconfiguredError) as raised:
            limiter.check()
        text = str(raised.exception)
        self.assertIn("may not run 'fcall_ro' (nor 'evalsha', 'eval')", text)
        self.assertIn('"+evalsha +eval +time +get +set +hmget +hset +pexpireat +del"', text)
        self.assertIn("docs/clients.md#permissions", text)
        with self.assertLogs("redis_rl", "ERROR"):
            self.assertEqual(limiter.acquire("k", SLOW).source, "open")
        self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (1, 0))

    def test_a_missing_permission_inside_the_script_is_a_misconfiguration(self):
        for path, rule_set in (("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                s = self.server(path)
                with s.admin() as admin:
                    add_user(admin, [r for r in rules(rule_set) if r != "+time"])
                limiter = self.limiter(s.port, {"username": "app", "password": "pw"}, on_error="open")
                with self.assertRaisesRegex(MisconfiguredError,
                                            "NOPERM.*inside the redis-rl function or script"):
                    limiter.check()
                with self.assertLogs("redis_rl", "ERROR"):
                    self.assertEqual(limiter.acquire("k", SLOW).source, "open")
                self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (1, 0))

    def test_down_is_not_a_misconfiguration(self):
        s = self.server("lua")
        limiter = self.limiter(s.port, on_error="open", timeout_ms=300)
        s.stop()
        with self.assertLogs("redis_rl", "WARNING"):
            self.assertIsNone(limiter.check())
        self.assertEqual(limiter.acquire("k", SLOW).source, "open")
        self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (0, 1))

    def test_asyncio_check_and_paths(self):
        async def run(port, user):
            # connect(): no retries (redis-py's default retries a refused password for seconds).
            client = rl_asyncio.connect(f"redis://127.0.0.1:{port}", username=user[0], password=user[1])
            try:
                limiter = rl_asyncio.Limiter(client, on_error="open")
                path = await limiter.check()
                d = await limiter.acquire("k", SLOW)
                return path, d.source, limiter.counters["misconfigured"]
            finally:
                await client.aclose()

        for path, rule_set in (("module", "module"), ("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                s = self.server(path)
                with s.admin() as admin:
                    add_user(admin, rules(rule_set))
                self.assertEqual(asyncio.run(run(s.port, ("app", "pw"))), (path, SOURCE[path], 0))
        with self.assertRaisesRegex(MisconfiguredError, "authentication failed"):
            asyncio.run(run(s.port, ("app", "wrong")))

    def test_asyncio_check_names_a_wrong_password_through_redis_pys_retries(self):
        s = self.server("lua")

        async def run():
            client = redis.asyncio.Redis(port=s.port, username="default", password="wrong")
            try:
                await rl_asyncio.Limiter(client, on_error="open").check()
            finally:
                await client.aclose()

        with s.admin() as admin:
            admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">right")
        with self.assertRaisesRegex(MisconfiguredError, "authentication failed"):
            asyncio.run(run())


class RedisPaths(Paths):
    binary = None


class ValkeyPaths(Paths):
    binary = VALKEY or False

    def server(self, path, extra=()):
        if path == "module" and not os.path.exists(MODULE):
            self.skipTest("no module build")
        return super().server(path, extra)


del Paths


class ClusterPaths(unittest.TestCase):
    """A two-master cluster on free ports, with the module or without it."""

    binary = None

    def setUp(self):
        if self.binary is False:
            self.skipTest("no Valkey 9: make servers, or valkey-server on PATH")

    def cluster(self, module=True, extra=()):
        c = Cluster(2, module=module, binary=self.binary, extra=extra)
        self.addCleanup(c.close)
        return c

    def client(self, c, **kwargs):
        client = redis.RedisCluster(host="127.0.0.1", port=c.port, socket_timeout=2, **kwargs)
        self.addCleanup(client.close)
        return client

    def test_each_path_under_least_privilege_on_a_cluster(self):
        for path, rule_set in (("module", "module"), ("functions", "functions"), ("lua", "script")):
            with self.subTest(path):
                c = self.cluster(module=(path == "module"))
                for s in c.servers:
                    with s.admin() as admin:
                        add_user(admin, rules(rule_set, cluster=True))
                if path == "functions":
                    self.assertEqual(redis_rl.load_functions(self.client(c)), redis_rl.FUNCTIONS_VERSION)
                limiter = Limiter(self.client(c, username="app", password="pw"), on_error="closed")
                self.assertEqual(limiter.check(), path)
                # Keys on both masters.
                for key in ("a", "b", "c", "d"):
                    got = [limiter.acquire(key, SLOW) for _ in range(4)]
                    self.assertEqual([(d.allowed, d.remaining, d.source) for d in got],
                                     [(True, 2, SOURCE[path]), (True, 1, SOURCE[path]),
                                      (True, 0, SOURCE[path]), (False, 0, SOURCE[path])], key)
                self.assertEqual(c.calls("script|load"), 0)
                # acquire_all over two slots: the server's CROSSSLOT, on every path.
                with self.assertRaises(redis.exceptions.ClusterCrossSlotError):
                    limiter.acquire_all([("x1", SLOW), ("x2", SLOW)])
                d = limiter.acquire_across_slots([("p", SLOW, 2), ("q", SLOW, 3)])
                self.assertEqual((d.allowed, [o.kind for o in d.outcomes]), (True, ["taken", "taken"]))
                refused = limiter.acquire_across_slots([("p2", SLOW, 2), ("q", SLOW, 1)])
                self.assertEqual((refused.allowed, [o.kind for o in refused.outcomes]),
                                 (False, ["not_taken", "refused"]))
                # The take on p2 was refunded: its bucket is full.
                self.assertEqual(limiter.peek("p2", SLOW, 0).remaining, 3)

    def test_command_renamed_away_on_a_cluster_is_named(self):
        # redis-py's cluster client reads the command table with COMMAND as it starts (sync:
        # when built; asyncio: on first use): without COMMAND it cannot run, and says why.
        c = self.cluster(module=False, extra=["--rename-command", "COMMAND", ""])
        with self.assertRaisesRegex(MisconfiguredError, "COMMAND"):
            redis_rl.connect_cluster(f"redis://127.0.0.1:{c.port}")

        async def run():
            client = redis.asyncio.RedisCluster(host="127.0.0.1", port=c.port)
            try:
                await rl_asyncio.Limiter(client, on_error="open").check()
            finally:
                await client.aclose()

        with self.assertRaisesRegex(MisconfiguredError, "COMMAND"):
            asyncio.run(run())

    def test_a_plain_client_on_a_cluster_is_a_misconfiguration(self):
        c = self.cluster(module=False)
        limiter = Limiter(redis.Redis(port=c.port), on_error="open")
        self.addCleanup(limiter.client.close)
        with self.assertRaisesRegex(MisconfiguredError, "connected to a Redis Cluster"):
            limiter.check()
        # Keys on the other master: MOVED, decided by the policy and counted apart.
        keys = [k for k in ("a", "b", "c", "d", "e", "f") if redis_rl.key_slot(k) >= 8192]
        self.assertTrue(keys)
        with self.assertLogs("redis_rl", "ERROR"):
            for key in keys:
                self.assertEqual(limiter.acquire(key, SLOW).source, "open")
        self.assertEqual((limiter.counters["misconfigured"], limiter.counters["outages"]), (len(keys), 0))

    def test_a_cluster_client_on_one_server_is_a_misconfiguration(self):
        s = Server(module=False, binary=self.binary)
        self.addCleanup(s.close)
        with self.assertRaisesRegex(MisconfiguredError, "not a cluster"):
            redis_rl.connect_cluster(s.url)

        async def run():
            client = redis.asyncio.RedisCluster(host="127.0.0.1", port=s.port)
            limiter = rl_asyncio.Limiter(client, on_error="open")
            try:
                with self.assertRaisesRegex(MisconfiguredError, "not a cluster"):
                    await limiter.check()
                d = await limiter.acquire("k", SLOW)
                return d.source, limiter.counters["misconfigured"], limiter.counters["outages"]
            finally:
                await client.aclose()

        with self.assertLogs("redis_rl", "ERROR"):
            self.assertEqual(asyncio.run(run()), ("open", 1, 0))

    def test_asyncio_cluster_functions_and_across_slots(self):
        c = self.cluster(module=False)

        async def run():
            client = redis.asyncio.RedisCluster(host="127.0.0.1", port=c.port)
            try:
                self.assertEqual(await rl_asyncio.load_functions(client), redis_rl.FUNCTIONS_VERSION)
                limiter = rl_asyncio.Limiter(client, on_error="closed")
                self.assertEqual(await limiter.check(), "functions")
                out = [(await limiter.acquire(k, SLOW)).source for k in ("a", "b", "c")]
                with self.assertRaises(redis.exceptions.ClusterCrossSlotError):
                    await limiter.acquire_all([("x1", SLOW), ("x2", SLOW)])
                d = await limiter.acquire_across_slots([SlotItem("p", SLOW, 3),
                                                        SlotItem("q", SLOW, 4, shadow=True)])
                return out, d.allowed, [o.kind for o in d.outcomes]
            finally:
                await client.aclose()

        self.assertEqual(asyncio.run(run()), (["functions"] * 3, True, ["taken", "shadow_refused"]))


class RedisClusterPaths(ClusterPaths):
    binary = None


class ValkeyClusterPaths(ClusterPaths):
    binary = VALKEY or False


del ClusterPaths


if __name__ == "__main__":
    unittest.main()
