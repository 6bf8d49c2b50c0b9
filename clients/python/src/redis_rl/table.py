"""Bucket tables: many buckets in a few keys, spread over a cluster (docs/tables.md).

`limiter.table(name, shards=S)` gives a `Table` (or, on the asyncio limiter, an `AsyncTable`)
whose buckets are named by fields; `limiter.table(name, expected_buckets=N)` picks S itself,
`shards_for(N)`, so that no table holds more than `MAX_BUCKETS_PER_TABLE` buckets. A field lives in the table `name:{i}` with
i = `shard_of(field, S)`, so one limit's fields spread over S keys, each in the slot of its
hash tag `{i}`. With the module, the calls are RL.HACQUIRE, RL.HPEEK, RL.HREFUND, RL.HCHARGE,
RL.HRESERVE, RL.HSETTLE, RL.HDEL and RL.HLEN on those keys. Without it, the shipped Lua script
keeps one key per field, `name:{i}:field`: the same hash tag, so in a cluster a shard's fallback keys share its slot.

The decisions go through the limiter that made the table, with its engine: the same failure
policy, the same deny cache (a table's field is known by its fallback key) and the same module
detection. Nothing here does more than name things and send the two calls that are not
decisions (delete, len).
"""

import asyncio
import hashlib
import logging
from typing import Any, Optional

from ._core import CHECK_KEYS

#: The most shards a limit may be spread over: there are no more slots than this to use.
MAX_SHARDS = 16384
#: The most fields `delete` sends in one command, so no one call keeps the server long.
DELETE_BATCH = 1000
#: The most buckets `expected_buckets` puts in one table: the largest table whose `MIGRATE`
#: (what resharding a cluster does to a key) measured under 100 ms, from the run of
#: `make bench-tables` in bench/tables.md (125,976, rounded down to a thousand; Redis 7.0.15 on
#: a shared 2-core machine, docs/tables.md#choosing-shards). A bigger table blocks the node
#: that moves it for longer. The Node and Rust libraries use the same figure.
MAX_BUCKETS_PER_TABLE = 125_000

log = logging.getLogger("redis_rl")


def shards_for(expected_buckets: int) -> int:
    """How many tables keep `expected_buckets` buckets at `MAX_BUCKETS_PER_TABLE` or fewer
    each: max(1, ceil(expected_buckets / MAX_BUCKETS_PER_TABLE))."""
    if (not isinstance(expected_buckets, int) or isinstance(expected_buckets, bool)
            or expected_buckets < 0):
        raise ValueError("expected_buckets must be a non-negative integer")
    shards = max(1, -(-expected_buckets // MAX_BUCKETS_PER_TABLE))
    if shards > MAX_SHARDS:
        raise ValueError(f"expected_buckets {expected_buckets} needs {shards} shards of at most "
                         f"{MAX_BUCKETS_PER_TABLE} buckets, more than the {MAX_SHARDS} there can be")
    return shards


def resolve_shards(name: str, shards: Optional[int], expected_buckets: Optional[int]) -> int:
    """The shard count of `limiter.table`: `shards` if given, else `shards_for(expected_buckets)`
    if that is given, else 1. Given both, too few shards for the expected buckets is allowed
    (a single server never moves its keys) but logged as a warning naming the count that fits."""
    if expected_buckets is None:
        return 1 if shards is None else shards
    needed = shards_for(expected_buckets)
    if shards is None:
        return needed
    if isinstance(shards, int) and not isinstance(shards, bool) and 1 <= shards < needed:
        log.warning("table %r: %d shards for %d expected buckets put up to %d in one table, more "
                    "than the %d whose MIGRATE stays under 100 ms; %d shards would keep each under it",
                    name, shards, expected_buckets, -(-expected_buckets // shards),
                    MAX_BUCKETS_PER_TABLE, needed)
    return shards


def shard_of(field: str, shards: int) -> int:
    """The shard of `field` among `shards`: the first 8 bytes of SHA-1 over its UTF-8 bytes,
    big-endian, modulo `shards`. The Node and Rust libraries compute the same
    (clients/vectors/table.json)."""
    digest = hashlib.sha1(field.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


class TableField(str):
    """One bucket of a table as the limiter's engine sees it.

    The string is the field's fallback key `name:{i}:field`: the Lua script's key, and the
    name the deny cache and the `local` policy keep the bucket under. `table` and `field` are
    the module command's key and field (see `_core.Engine.command`).
    """

    def __new__(cls, table, field):
        self = super().__new__(cls, f"{table}:{field}")
        self.table = table
        self.field = field
        return self


def _check_field(field):
    if not isinstance(field, str):
        raise TypeError("field must be a str (encode binary names, e.g. as hex)")
    return field


def _lua_pattern(name):
    """SCAN MATCH for every fallback key of table `name`, `name:{*}:*`, the name's glob
    characters escaped. `_TableBase._ours` then keeps the keys of shards below `shards`."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in name)
    return escaped + ":{*}:*"


class _TableBase:
    def __init__(self, limiter, name, shards=None, expected_buckets=None):
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty str")
        if "{" in name or "}" in name:
            # A brace in the name would become the hash tag and put every shard in one slot.
            raise ValueError("name must not contain { or } (the shard index is the hash tag)")
        shards = resolve_shards(name, shards, expected_buckets)
        if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer from 1 to {MAX_SHARDS}")
        self._limiter = limiter
        self.name = name
        self.shards = shards

    def __repr__(self):
        return f"{type(self).__name__}(name={self.name!r}, shards={self.shards})"

    def key(self, shard: int) -> str:
        """The table key of shard `shard`: `name:{shard}`."""
        return f"{self.name}:{{{shard}}}"

    def bucket(self, field: str) -> "TableField":
        """The bucket of `field`: a `TableField` (its table key, and its fallback key)."""
        return TableField(self.key(shard_of(_check_field(field), self.shards)), field)

    def _by_table(self, fields):
        """{table key: [TableField, ...]} for the distinct fields, in the order given."""
        groups = {}
        for field in dict.fromkeys(_check_field(f) for f in fields):
            bucket = self.bucket(field)
            groups.setdefault(bucket.table, []).append(bucket)
        return groups

    def _delete_commands(self, groups, mode):
        """RL.HDEL (module) or DEL (Functions library, script) of each shard's fields,
        DELETE_BATCH at a time."""
        for table, buckets in groups.items():
            for start in range(0, len(buckets), DELETE_BATCH):
                batch = buckets[start:start + DELETE_BATCH]
                if mode == "module":
                    yield ("RL.HDEL", table, *(b.field for b in batch))
                else:
                    yield ("DEL", *batch)

    def _detection(self):
        """The engine's steps that find the path (module, Functions library, script) when it is
        not known yet, as `check()` does (a peek, which writes nothing): run by the limiter's
        `_drive`. Returns the path."""
        return (yield from self._limiter._engine.probe_steps(CHECK_KEYS[0]))

    def _forget(self, buckets):
        """A reset bucket is full: drop what the shield and the local policy hold for it."""
        engine = self._limiter._engine
        for bucket in buckets:
            engine.forget(bucket)
            with engine.lock:
                engine.local.forget(bucket)

    def _scan_nodes(self):
        """Where the fallback keys are: the nodes owning the shards' slots on a cluster client
        (each once), else the client itself."""
        client = self._limiter.client
        if not hasattr(client, "get_node_from_key"):
            return [client]
        nodes = {}
        for i in range(self.shards):
            node = client.get_node_from_key(self.key(i))
            nodes.setdefault(node.name, getattr(node, "redis_connection", None) or node)
        return list(nodes.values())

    def _ours(self, keys):
        """How many of SCAN's `keys` are fallback keys of a shard below `shards`: the pattern
        also matches `name:{x}:…` for any x, such as the shards of a larger S."""
        prefix = f"{self.name}:{{"
        count = 0
        for key in keys:
            key = key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key
            end = key.find("}:", len(prefix))
            index = key[len(prefix):end]
            if (key.startswith(prefix) and end > 0 and index.isascii() and index.isdigit() and str(int(index)) == index
                    and int(index) < self.shards):
                count += 1
        return count


class Table(_TableBase):
    """A limit's buckets named by field, over `shards` tables (see the module docstring).

    `acquire`, `peek`, `charge`, `refund`, `reserve` and `settle` take and reply as the
    limiter's methods of the same names, with a field for the key. `delete(*fields)` resets buckets and returns how many were live
    (not full); `len()` counts the live buckets over all the shards. Those two are not
    decisions: when Redis cannot answer they raise, whatever the failure policy.
    """

    def acquire(self, field: str, limit: Any, cost: Any = 1) -> Any:
        """Takes `cost` tokens from the bucket `field` of `limit`; returns a Decision."""
        return self._limiter.acquire(self.bucket(field), limit, cost)

    def peek(self, field: str, limit: Any, cost: Any = 1) -> Any:
        """What `acquire` would decide for `cost`, taking nothing."""
        return self._limiter.peek(self.bucket(field), limit, cost)

    def charge(self, field: str, limit: Any, cost: Any) -> Any:
        """Applies the post-paid `cost` to the bucket `field`, into debt if need be (RL.HCHARGE;
        see `redis_rl.Limiter.charge`); returns a Charge."""
        return self._limiter.charge(self.bucket(field), limit, cost)

    def refund(self, field: str, limit: Any, cost: Any = 1) -> Any:
        """Gives `cost` tokens back to the bucket `field` and clears its deny-cache entry."""
        return self._limiter.refund(self.bucket(field), limit, cost)

    def reserve(self, field: str, limit: Any, estimate: Any, ttl_ms: int, id: Any = None) -> Any:
        """Takes `estimate` tokens from the bucket `field` now and records the take for
        `ttl_ms` (RL.HRESERVE; on the fallbacks the reserve of the field's own key); returns
        a Reservation whose `settle(actual)` settles it on that bucket (RL.HSETTLE)."""
        return self._limiter.reserve(self.bucket(field), limit, estimate, ttl_ms, id=id)

    def settle(self, field: str, limit: Any, id: Any, actual: Any) -> Any:
        """Settles the reservation `id` of the bucket `field` by id (RL.HSETTLE); returns a
        Charge, as `redis_rl.Limiter.settle`."""
        return self._limiter.settle(self.bucket(field), limit, id, actual)

    def delete(self, *fields: str) -> int:
        """Resets the buckets of `fields` (full again); returns how many were live."""
        groups = self._by_table(fields)
        self._forget(b for group in groups.values() for b in group)
        return sum(self._limiter.client.execute_command(*args)
                   for args in self._delete_commands(groups, self._mode()))

    def len(self) -> int:
        """Live buckets over all the shards (RL.HLEN; on the Functions and script paths, one
        SCAN of the fallback keys on each node holding a shard)."""
        if self._mode() == "module":
            return sum(self._limiter.client.execute_command("RL.HLEN", self.key(i)) for i in range(self.shards))
        count = 0
        for node in self._scan_nodes():
            cursor = 0
            while True:
                cursor, keys = node.execute_command("SCAN", cursor, "MATCH", _lua_pattern(self.name), "COUNT", 1000)
                count += self._ours(keys)
                if int(cursor) == 0:
                    break
        return count

    def _mode(self):
        return self._limiter._drive(self._detection())


class AsyncTable(_TableBase):
    """The asyncio `Table`: the same methods, awaited."""

    async def acquire(self, field, limit, cost=1):
        """Takes `cost` tokens from the bucket `field` of `limit`; returns a Decision."""
        return await self._limiter.acquire(self.bucket(field), limit, cost)

    async def peek(self, field, limit, cost=1):
        """What `acquire` would decide for `cost`, taking nothing."""
        return await self._limiter.peek(self.bucket(field), limit, cost)

    async def charge(self, field, limit, cost):
        """Applies the post-paid `cost` to the bucket `field`, into debt if need be (RL.HCHARGE;
        see `redis_rl.Limiter.charge`); returns a Charge."""
        return await self._limiter.charge(self.bucket(field), limit, cost)

    async def refund(self, field, limit, cost=1):
        """Gives `cost` tokens back to the bucket `field` and clears its deny-cache entry."""
        return await self._limiter.refund(self.bucket(field), limit, cost)

    async def reserve(self, field, limit, estimate, ttl_ms, id=None):
        """As `Table.reserve`, awaited: an AsyncReservation (`await r.settle(actual)`)."""
        return await self._limiter.reserve(self.bucket(field), limit, estimate, ttl_ms, id=id)

    async def settle(self, field, limit, id, actual):
        """As `Table.settle`, awaited."""
        return await self._limiter.settle(self.bucket(field), limit, id, actual)

    async def delete(self, *fields):
        """Resets the buckets of `fields` (full again); returns how many were live."""
        groups = self._by_table(fields)
        self._forget(b for group in groups.values() for b in group)
        deleted = 0
        for args in self._delete_commands(groups, await self._mode()):
            deleted += await self._deadline(self._limiter.client.execute_command(*args))
        return deleted

    async def len(self):
        """Live buckets over all the shards, as `Table.len`."""
        limiter = self._limiter
        if await self._mode() == "module":
            total = 0
            for i in range(self.shards):
                total += await self._deadline(limiter.client.execute_command("RL.HLEN", self.key(i)))
            return total
        count = 0
        for node in self._scan_nodes():
            cursor = 0
            while True:
                cursor, keys = await self._deadline(
                    node.execute_command("SCAN", cursor, "MATCH", _lua_pattern(self.name), "COUNT", 1000))
                count += self._ours(keys)
                if int(cursor) == 0:
                    break
        return count

    async def _mode(self):
        return await self._deadline(self._limiter._drive(self._detection()))

    async def _deadline(self, call):
        return await asyncio.wait_for(call, self._limiter._engine.timeout_s)
