#!/usr/bin/env python3
"""Writes clients/vectors/lease.json and clients/vectors/reserve.json: test vectors for leases
(RL.LEASE, RL.RELEASE, RL.RENEW, RL.LEASES) and reservations (RL.RESERVE, RL.SETTLE), from the
slow, obviously right models below. The module's pure steps are held to them
(crates/rl-bucket/tests/lease_vectors.rs), and so is the Lua fallback, script and Functions
library (clients/python/tests/test_lua_lease_vectors.py).

Run from the repository root:  python3 clients/vectors/lease_generate.py  (--check: exit 1
if a file is not what the models make).

Format 1 for both: {"format": 1, "cases": [case, ...]}; every case starts from a missing key
and carries its key's value from step to step; `now_us` is µs since the epoch.

lease.json: a case is {"name", "steps"}; a step is {"now_us", "op", ..., "expect"} with
    op "lease"   + "limit", "ttl_ms", "id"  expect [allowed, id, in_use, expires_in_ms or
                                                    retry_after_ms] (id "" when denied)
    op "release" + "id"                     expect 1 or 0
    op "renew"   + "id", "ttl_ms"           expect 1 or 0
    op "leases"  + "limit"                  expect [in_use, retry_after_ms]

reserve.json: a case is {"name", "rate", "capacity", "steps"} (rate and capacity as in
bucket.json); a step is {"now_us", "op", ..., "expect"} with
    op "reserve" + "estimate", "ttl_ms", "id"  expect [allowed, id, remaining, retry_after_ms]
    op "settle"  + "actual", "id"              expect [balance, retry_after_ms,
                                                       reset_after_ms], or {"error": text}
    op "acquire" | "charge" | "refund" + "cost" expect as in bucket.json
Ids are the caller's (the fallback always sends one). Every number here is exact in the
script's arithmetic (clients/lua/rl.lua's header), so the script must match every step.
"""

import json
import os
import sys
from fractions import Fraction
from math import ceil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import T0, Model, ceil_ms, decimal  # noqa: E402

US_PER_MS = 1000


class Leases:
    """One lease key: id -> absolute expiry in µs; a lease counts while now < expiry."""

    def __init__(self):
        self.held = {}

    def live(self, now):
        return sorted((at, i) for i, at in self.held.items() if at > now)

    def wait(self, live, limit, now):
        if len(live) < limit:
            return 0
        return ceil((live[len(live) - limit][0] - now) / US_PER_MS)

    def drop(self, now):
        self.held = {i: at for i, at in self.held.items() if at > now}

    def step(self, now, op, limit=None, ttl_ms=None, id=None):
        live = self.live(now)
        if op == "leases":
            return [len(live), self.wait(live, limit, now)]
        if op == "lease":
            if id in self.held and self.held[id] > now:
                return [1, id, len(live), ceil((self.held[id] - now) / US_PER_MS)]
            if len(live) >= limit:
                return [0, "", len(live), self.wait(live, limit, now)]
            self.drop(now)
            self.held[id] = now + ttl_ms * US_PER_MS
            return [1, id, len(live) + 1, ttl_ms]
        if not (id in self.held and self.held[id] > now):
            return 0
        self.drop(now)
        if op == "release":
            del self.held[id]
        else:
            self.held[id] = now + ttl_ms * US_PER_MS
        return 1


def lease_case(name, steps):
    model, out = Leases(), []
    for dt, op, *rest in steps:
        now = T0 + dt
        if op == "lease":
            args = dict(limit=rest[0], ttl_ms=rest[1], id=rest[2])
        elif op == "leases":
            args = dict(limit=rest[0])
        elif op == "release":
            args = dict(id=rest[0])
        else:
            args = dict(id=rest[0], ttl_ms=rest[1])
        out.append({"now_us": now, "op": op, **args, "expect": model.step(now, op, **args)})
    return {"name": name, "steps": out}


def lease_cases():
    yield lease_case("take to the limit, deny, wait for the earliest", [
        (0, "lease", 2, 1000, "a"), (10, "lease", 2, 500, "b"), (20, "lease", 2, 1000, "c"),
        (20, "leases", 2), (20, "leases", 1), (20, "leases", 3),
        (509_999, "lease", 2, 1000, "c"), (510_000, "lease", 2, 1000, "c"),
        (510_000, "leases", 2)])
    yield lease_case("a retried id is answered as held, unchanged", [
        (0, "lease", 1, 1000, "w"), (333, "lease", 1, 5000, "w"), (999_999, "lease", 1, 1000, "w"),
        (1_000_000, "lease", 1, 1000, "w"), (1_000_001, "leases", 1)])
    yield lease_case("release frees a slot once", [
        (0, "lease", 1, 60_000, "x"), (1, "lease", 1, 60_000, "y"), (2, "release", "x"),
        (3, "release", "x"), (4, "lease", 1, 60_000, "y"), (5, "release", "nobody"),
        (6, "leases", 1)])
    yield lease_case("renew extends or shortens, never revives", [
        (0, "lease", 3, 100, "a"), (50_000, "renew", "a", 1000), (50_000, "leases", 1),
        (60_000, "renew", "a", 1), (61_000, "renew", "a", 1000), (61_000, "leases", 1),
        (61_001, "lease", 1, 10, "a"), (61_002, "renew", "b", 5)])
    yield lease_case("expired leases count for nothing", [
        (0, "lease", 2, 1, "a"), (0, "lease", 2, 2, "b"), (999, "leases", 2),
        (1000, "leases", 2), (1000, "lease", 2, 7, "c"), (1999, "lease", 2, 7, "d"),
        (2000, "lease", 2, 7, "d"), (2000, "leases", 1)])
    yield lease_case("a lower limit denies until enough go", [
        (0, "lease", 4, 3000, "a"), (1, "lease", 4, 2000, "b"), (2, "lease", 4, 1000, "c"),
        (3, "lease", 2, 1000, "d"), (3, "leases", 2), (3, "leases", 1), (2_000_001, "lease", 2, 1, "d")])
    yield lease_case("ids of 16 bytes, uneven ms", [
        (0, "lease", 1, 1, "0123456789abcdef"), (1, "lease", 1, 1, "fedcba9876543210"),
        (999, "lease", 1, 1, "fedcba9876543210"), (1000, "lease", 1, 3153600000000, "fedcba9876543210"),
        (1001, "leases", 1), (1002, "renew", "fedcba9876543210", 1), (1002, "leases", 1)])


class Reserving(Model):
    """A bucket (generate.py's exact model) with open reservations: id -> (estimate, expiry)."""

    def __init__(self, rate, capacity):
        super().__init__(rate, capacity)
        self.records = {}

    def open(self, now):
        return {i: r for i, r in self.records.items() if r[1] > now}

    def reserve(self, now, estimate, ttl_ms, id):
        if id in self.open(now):
            reply = self.acquire(now, "0")
            return [1, id, reply[1], 0] if reply[0] else [0, "", reply[1], reply[2]]
        reply = self.acquire(now, estimate)
        if not reply[0]:
            return [0, "", reply[1], reply[2]]
        self.records = self.open(now)
        self.records[id] = (decimal(estimate), now + ttl_ms * US_PER_MS)
        return [1, id, reply[1], 0]

    def settle(self, now, actual, id):
        record = self.open(now).get(id)
        if record is None:
            return {"error": f"ERR id {id} is not an open reservation of this key "
                             "(settled, expired or never made)"}
        estimate, actual = record[0], decimal(actual)
        self.records = {i: r for i, r in self.open(now).items() if i != id}
        now_ns = now * 1000
        if actual > estimate:
            self.full_at = max(self.full_at or 0, now_ns) + (actual - estimate) * self.t_ns
        elif actual < estimate and self.debt(now_ns) > 0:
            debt = max(Fraction(0), self.debt(now_ns) - min(estimate - actual, self.capacity) * self.t_ns)
            self.full_at = None if debt == 0 else now_ns + debt
            if debt == 0:
                self.records = {}  # the bucket, full again, is deleted with its records
        return self.charge(now, "0")[1:]

    def refund(self, now_us, cost):
        reply = super().refund(now_us, cost)
        if self.full_at is None:
            self.records = {}
        return reply


def reserve_case(name, rate, capacity, steps):
    model, out = Reserving(rate, capacity), []
    for dt, op, *rest in steps:
        now = T0 + dt
        if op == "reserve":
            args = dict(estimate=rest[0], ttl_ms=rest[1], id=rest[2])
            expect = model.reserve(now, *rest)
        elif op == "settle":
            args = dict(actual=rest[0], id=rest[1])
            expect = model.settle(now, *rest)
        else:
            args = dict(cost=rest[0])
            expect = model.step(op, now, rest[0])
        out.append({"now_us": now, "op": op, **args, "expect": expect})
    return {"name": name, "rate": rate, "capacity": capacity, "steps": out}


def reserve_cases():
    yield reserve_case("the pages' example: over, retry, under into debt", "1", "10", [
        (0, "reserve", "4", 60000, "export-7"), (0, "reserve", "4", 60000, "export-7"),
        (0, "reserve", "7", 60000, "other"), (0, "settle", "1", "export-7"),
        (0, "settle", "1", "export-7"), (0, "reserve", "2", 60000, "big"), (0, "settle", "12", "big"),
        (0, "acquire", "0"), (0, "reserve", "1", 1000, "late"), (4_000_000, "reserve", "1", 1000, "late"),
        (4_000_000, "reserve", "1", 1000, "late")])
    yield reserve_case("denied as acquire, to the ms; above capacity never", "3", "5", [
        (0, "reserve", "5", 1000, "a"), (1, "reserve", "1", 1000, "b"), (333_334, "reserve", "1", 1000, "b"),
        (333_334, "reserve", "6", 1000, "c"), (333_334, "settle", "0", "a")])
    yield reserve_case("a settle that leaves the bucket full deletes it, records and all", "2", "10", [
        (0, "reserve", "3", 60000, "a"), (0, "reserve", "2", 60000, "b"), (100, "settle", "0", "a"),
        (100, "settle", "0", "b"), (200, "settle", "1", "b")])
    yield reserve_case("lapsed records stand as taken", "1", "10", [
        (0, "reserve", "6", 1000, "a"), (999_999, "settle", "6", "a"), (999_999, "reserve", "1", 1000, "b"),
        (1_999_999, "settle", "0", "a"), (2_000_000, "settle", "0", "b"), (2_000_000, "acquire", "0"),
        (2_000_001, "reserve", "1", 10, "b")])
    yield reserve_case("a refund to full drops the records; acquire and charge keep them", "1", "10", [
        (0, "reserve", "4", 60000, "a"), (0, "acquire", "1"), (0, "charge", "2"), (0, "settle", "5", "a"),
        (0, "reserve", "1", 60000, "b"), (0, "refund", "10"), (0, "settle", "0", "b")])
    yield reserve_case("fractions exact: 0.1 per second, decimal estimates", "0.1", "2.5", [
        (0, "reserve", "1.5", 100000, "a"), (0, "reserve", "0.5", 100000, "b"),
        (1_000_000, "settle", "0.25", "a"), (2_000_000, "settle", "2.5", "b"),
        (3_000_000, "reserve", "0.1", 100000, "c")])
    yield reserve_case("N/S rate 100/60: a retry while in debt is denied as a peek", "100/60", "3", [
        (0, "reserve", "3", 10000, "a"), (0, "charge", "4"), (0, "reserve", "3", 10000, "a"),
        (0, "settle", "0", "a"), (0, "acquire", "0"), (5_000_000, "reserve", "3", 10000, "b"),
        (5_000_000, "settle", "1", "b"), (5_000_000, "reserve", "1", 1, "c"), (5_001_000, "settle", "1", "c")])
    yield reserve_case("7/s: estimate equal to actual changes nothing but the record", "7", "4", [
        (0, "reserve", "3", 5000, "x"), (142_857, "settle", "3", "x"), (142_857, "settle", "3", "x")])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    docs = {
        "lease.json": {"format": 1, "cases": list(lease_cases())},
        "reserve.json": {"format": 1, "cases": list(reserve_cases())},
    }
    stale = False
    for name, doc in docs.items():
        path, text = os.path.join(here, name), json.dumps(doc, indent=1) + "\n"
        if "--check" in sys.argv:
            with open(path) as f:
                stale = stale or f.read() != text
            continue
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}: {len(doc['cases'])} cases, {sum(len(c['steps']) for c in doc['cases'])} steps")
    if stale:
        sys.exit("clients/vectors/lease.json or reserve.json is stale: "
                 "run python3 clients/vectors/lease_generate.py")


if __name__ == "__main__":
    main()
