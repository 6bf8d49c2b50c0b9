"""All or nothing across hash slots: `Limiter.acquire_across_slots` and its asyncio twin take
every item's cost, or none, even when the keys sit in different slots of a cluster, where one
RL.ACQUIRE.MULTI cannot reach them all. The same plan, steps and reply as the Rust client's
`acquire_across_slots` (clients/rust/src/slots.rs).

On one server (or when every key shares a slot) it is one `acquire_all`: atomic. On a cluster
the items are grouped by hash slot and taken group by group, in slot order; when a later group
refuses (or fails), the groups already taken are refunded, so a refused call costs nothing.
Between a take and its refund (one round trip) another call can see those buckets short of
the refunded tokens: that is the one window where a cluster is not atomic.

Whether Redis is a cluster is learnt, not configured: the first call sends every item at once,
and a CROSSSLOT reply marks the limiter's engine, so that call and every later one go group by
group. A *shadow* item is counted and reported but never refuses the call: when only shadow
items refuse, they are left out, take nothing, and the rest is asked again.

`Across` is the plan as steps without I/O; the limiters send them through their own
`acquire_all` and `refund`, so the deny cache and the failure policy apply to each group.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ._core import Decision, Limit, Number, check_cost, is_crossslot


def key_slot(key: Union[str, bytes]) -> int:
    """The cluster hash slot of `key` (str or bytes): CRC16/XMODEM mod 16384 of the key, or of
    its first non-empty `{hash tag}` (the Redis Cluster specification)."""
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1:end]
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc % 16384


class SlotItem:
    """One bucket of an `acquire_across_slots` call: `key`, `limit`, `cost` (default 1) and
    `shadow` (counted and reported, but its refusal does not refuse the call)."""

    __slots__ = ("key", "limit", "cost", "shadow")

    def __init__(self, key: str, limit: Limit, cost: Number = 1, shadow: bool = False) -> None:
        self.key, self.limit, self.cost, self.shadow = key, limit, cost, bool(shadow)

    def __repr__(self):
        return (f"SlotItem(key={self.key!r}, limit={self.limit!r}, cost={self.cost!r}, "
                f"shadow={self.shadow})")


class SlotOutcome:
    """What became of one item: `kind` is "taken" (its cost was taken and stays taken),
    "refused" (it refused, so nothing was taken), "shadow_refused" (a shadow item that refused:
    it took nothing and the others went on without it) or "not_taken" (another item refused);
    `decision` is the Decision Redis (or the policy) gave it, None when it was never asked or
    the deny cache refused it without asking Redis."""

    __slots__ = ("kind", "decision")

    def __init__(self, kind: str, decision: Optional[Decision] = None) -> None:
        self.kind, self.decision = kind, decision

    def __eq__(self, other):
        return isinstance(other, SlotOutcome) and (self.kind, self.decision) == (other.kind, other.decision)

    def __repr__(self):
        return f"SlotOutcome({self.kind!r}, {self.decision!r})"


class SlotsDecision:
    """The answer of `acquire_across_slots`: `allowed` (every item's cost was taken, shadow
    items that refused aside), `retry_after_ms` (the refusing group's longest wait, -1 if an
    item can never succeed, 0 if allowed), `outcomes` (one SlotOutcome per item, in order) and
    `sources` (who decided each `acquire_all` sent, in order: a "closed" among them means Redis
    could not decide)."""

    __slots__ = ("allowed", "retry_after_ms", "outcomes", "sources")

    def __init__(self, allowed: Any, retry_after_ms: Any, outcomes: Sequence[SlotOutcome],
                 sources: Sequence[str]) -> None:
        self.allowed = bool(allowed)
        self.retry_after_ms = int(retry_after_ms)
        self.outcomes = tuple(outcomes)
        self.sources = tuple(sources)

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self):
        return (f"SlotsDecision(allowed={self.allowed}, retry_after_ms={self.retry_after_ms}, "
                f"outcomes={list(self.outcomes)!r}, sources={list(self.sources)!r})")


def _item(item):
    if isinstance(item, SlotItem):
        return item
    key, limit, *rest = item
    return SlotItem(key, limit, *rest)


class Across:
    """One `acquire_across_slots` call as steps without I/O: `start()`, then `answer(multi,
    error)` after each ("ask", args) step and `refunded()` after a ("refund", args) step, until
    a ("done", (decision, error)) step."""

    def __init__(self, engine, items):
        self.items = [_item(item) for item in items]
        if not self.items:
            raise ValueError("acquire_across_slots needs at least one item")
        for item in self.items:
            check_cost(item.cost)
        self.engine = engine
        self.groups = []
        self.asking = []
        self.by_slot = False
        self.taken = []
        self.outcomes = [SlotOutcome("not_taken") for _ in self.items]
        self.sources = []
        self.ending = None
        self._group(engine.cluster)

    def _group(self, by_slot):
        """One group of every item, or one per slot in slot order (kept last first)."""
        self.by_slot = by_slot
        groups = {}
        for i, item in enumerate(self.items):
            groups.setdefault(key_slot(item.key) if by_slot else 0, []).append(i)
        self.groups = [groups[slot] for slot in sorted(groups, reverse=True)]

    def _args(self, indexes):
        return [(self.items[i].key, self.items[i].limit, self.items[i].cost) for i in indexes]

    def start(self):
        return self._next_group()

    def _next_group(self):
        if self.groups:
            self.asking = self.groups.pop()
            return "ask", self._args(self.asking)
        return "done", (SlotsDecision(True, 0, self.outcomes, self.sources), None)

    def answer(self, multi, error=None):
        """The next step, given what `acquire_all` of the last "ask" returned (or raised)."""
        if error is not None:
            if not self.by_slot and not self.taken and is_crossslot(error):
                # A cluster: nothing was taken, so start again group by group.
                self.engine.cluster = True
                self._group(True)
                return self._next_group()
            return self._end(None, error)
        self.sources.append(multi.source)
        if multi.allowed:
            for pos, i in enumerate(self.asking):
                if pos < len(multi.decisions):
                    self.outcomes[i] = SlotOutcome("taken", multi.decisions[pos])
            self.taken += self.asking
            self.asking = []
            return self._next_group()
        # Which items refused: each decision says so; the deny cache knows only the first.
        if not multi.decisions:
            index = multi.refused_index
            refusing = [self.asking[index]] if 0 <= index < len(self.asking) else []
        else:
            refusing = [i for i, d in zip(self.asking, multi.decisions) if not d.allowed]

        def decision_of(i):
            pos = self.asking.index(i)
            return multi.decisions[pos] if pos < len(multi.decisions) else None

        if refusing and all(self.items[i].shadow for i in refusing):
            for i in refusing:
                self.outcomes[i] = SlotOutcome("shadow_refused", decision_of(i))
            self.asking = [i for i in self.asking if i not in refusing]
            if not self.asking:
                return self._next_group()
            return "ask", self._args(self.asking)
        for i in self.asking:
            if i in refusing:
                kind = "shadow_refused" if self.items[i].shadow else "refused"
            else:
                kind = "not_taken"
            self.outcomes[i] = SlotOutcome(kind, decision_of(i))
        return self._end(SlotsDecision(False, multi.retry_after_ms, (), ()), None)

    def _end(self, decision, error):
        """Ends with `decision` or `error`, giving back what earlier groups took first."""
        self.ending = (decision, error)
        if not self.taken:
            return self.refunded()
        taken, self.taken = self.taken, []
        for i in taken:
            if self.outcomes[i].kind == "taken":
                self.outcomes[i] = SlotOutcome("not_taken", self.outcomes[i].decision)
        return "refund", self._args(taken)

    def refunded(self):
        """The last step, once the refunds asked for are done."""
        decision, error = self.ending
        if decision is not None:
            decision = SlotsDecision(decision.allowed, decision.retry_after_ms, self.outcomes, self.sources)
        return "done", (decision, error)
