#!/usr/bin/env python3
"""Writes clients/vectors/table.json: the vectors of the client libraries' bucket tables.

Two parts, both read by the Python, Node and Rust libraries' tests:

- "shards": which of a table's `shards` tables a field lands in. The rule (docs/tables.md,
  "Client libraries"): the first 8 bytes of SHA-1 over the field's UTF-8 bytes, read as a
  big-endian unsigned 64-bit integer, modulo `shards`. Each case also gives the shard's table
  key `name:{i}` and the field's fallback key `name:{i}:field` (the Lua script's key for the
  field on a server without the module), so all three libraries name them byte for byte alike.
- "sequences": calls on one table (acquire, peek, refund, delete, len) with the replies the
  module gives, computed from the bucket model of generate.py (exact rationals). Every step of
  a sequence happens at one instant, at rates so slow that nothing refills while a test runs,
  so a test against a real server checks `allowed`, `remaining`, `delete`'s and `len`'s
  replies exactly and the millisecond fields within the time the test took. Each library runs
  them on the module's tables and on the Lua fallback, which must agree.

Run from the repository root:  python3 clients/vectors/table_generate.py  (rewrites the file);
`--check` fails when it is stale (make test-clients-python runs that).

Format 1: {"format": 1, "shards": [{"field", "shards", "shard", "table_key", "fallback_key"}],
"sequences": [{"name", "table", "shards", "rate", "capacity", "steps": [step]}]}, each step
one of {"op": "acquire" | "peek" | "refund", "field", "cost", "expect": [...]} (the per-key
replies), {"op": "delete", "fields": [...], "expect": n} (how many were live) or
{"op": "len", "expect": n} (live buckets over all the shards).
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import T0, Model  # noqa: E402  (the one bucket model)


def shard_of(field, shards):
    """The rule, as plainly as it can be written."""
    digest = hashlib.sha1(field.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


SHARD_FIELDS = ["", "a", "user:42", "203.0.113.7", "2001:db8::1", "field with spaces",
                "ünïcödé", "日本語", "emoji 🚦", "{braces}", "x" * 300]
SHARD_COUNTS = [1, 2, 3, 7, 16, 64, 1000, 16384]


def shard_cases():
    name = "api"
    for field in SHARD_FIELDS:
        for shards in SHARD_COUNTS:
            i = shard_of(field, shards)
            yield {"field": field, "shards": shards, "shard": i, "table_key": f"{name}:{{{i}}}",
                   "fallback_key": f"{name}:{{{i}}}:{field}"}
    # Many fields at one count, so a mistake in any byte of the digest shows.
    for n in range(64):
        field = f"user:{n}"
        i = shard_of(field, 16)
        yield {"field": field, "shards": 16, "shard": i, "table_key": f"{name}:{{{i}}}",
               "fallback_key": f"{name}:{{{i}}}:{field}"}


def sequence(name, table, shards, rate, capacity, steps):
    buckets = {}
    now_us = T0
    out = []

    def live(field):
        b = buckets.get(field)
        return b is not None and b.debt(now_us * 1000) > 0

    for step in steps:
        op = step[0]
        if op in ("acquire", "peek", "refund"):
            _, field, cost = step
            bucket = buckets.setdefault(field, Model(rate, capacity))
            out.append({"op": op, "field": field, "cost": cost, "expect": bucket.step(op, now_us, cost)})
        elif op == "delete":
            fields = step[1]
            count = sum(1 for f in dict.fromkeys(fields) if live(f))
            for f in fields:
                buckets.pop(f, None)
            out.append({"op": "delete", "fields": fields, "expect": count})
        else:
            out.append({"op": "len", "expect": sum(1 for f in buckets if live(f))})
    return {"name": name, "table": table, "shards": shards, "rate": rate, "capacity": capacity, "steps": out}


def sequences():
    fields = [f"user:{n}" for n in range(6)]
    yield sequence("fields are separate buckets, over 4 shards", "t1", 4, "0.001", "3",
                   [("acquire", f, "1") for f in fields] + [("len",)]
                   + [("acquire", "user:0", "1"), ("acquire", "user:0", "1"), ("acquire", "user:0", "1"),
                      ("peek", "user:0", "1"), ("peek", "user:1", "2"), ("acquire", "user:1", "4")])
    yield sequence("refund to full leaves the bucket dead, delete counts the live", "t2", 3, "0.001", "5",
                   [("acquire", "a", "2"), ("acquire", "b", "5"), ("acquire", "c", "0"), ("len",),
                    ("refund", "a", "1"), ("refund", "a", "1"), ("len",), ("refund", "never", "1"),
                    ("delete", ["a", "b", "c", "never", "b"]), ("len",), ("acquire", "b", "5"),
                    ("acquire", "b", "1")])
    yield sequence("one shard, fractional costs", "t3", 1, "0.001", "2.5",
                   [("acquire", "x", "0.5"), ("acquire", "x", "1.5"), ("acquire", "x", "0.6"),
                    ("acquire", "x", "0.5"), ("peek", "x", "0"), ("acquire", "y", "2.5"), ("len",),
                    ("delete", ["x"]), ("len",), ("acquire", "x", "2.5")])
    yield sequence("non-ASCII and empty fields, 16 shards", "t4", 16, "0.002", "1",
                   [("acquire", "日本語", "1"), ("acquire", "日本語", "1"), ("acquire", "", "1"),
                    ("acquire", "", "1"), ("acquire", "emoji 🚦", "1"), ("len",),
                    ("delete", ["", "日本語", "emoji 🚦"]), ("len",)])


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table.json")
    doc = {"format": 1, "shards": list(shard_cases()), "sequences": list(sequences())}
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{path} is stale: run python3 clients/vectors/table_generate.py")
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {path}: {len(doc['shards'])} shard cases, {len(doc['sequences'])} sequences")


if __name__ == "__main__":
    main()
