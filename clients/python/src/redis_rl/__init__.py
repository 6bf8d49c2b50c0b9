"""redis-rl client: rate limits on Redis with the redis-rl module, with an explicit failure
policy, a hot-key shield and two fallbacks for servers without the module (the Functions
library redis_rl, loaded by `load_functions`, and the Lua script).

    from redis_rl import Limiter, Limit, connect
    limiter = Limiter(connect("redis://127.0.0.1:6379"), on_error="local", instances=4,
                      deny_cache=True, without_module="lua")
    d = limiter.acquire("user:42", Limit(rate=5, capacity=10), cost=1)
    if not d.allowed: ...  # 429 with d.headers()
    limiter.acquire("api:42", Limit(100, per=60))  # 100 a minute, sent as 100/60
    limiter.check()  # at startup: the path, or MisconfiguredError naming what to fix

Layout: `_core` holds the types, the policy, the shield and each call's steps (no I/O);
`_decimal` the text sent for a number and its exact value; `client` the sync limiter and
`asyncio` its awaited twin (only the I/O); `_slots` all or nothing across hash slots;
`bucket` the exact in-process bucket; `lease` the types of leases and reservations and the
local lease table, `hold` the `with` / `async with` scopes of a lease; `rl.lua` the fallback script and `rl_functions.lua` the
Functions library (copies of clients/lua/, kept equal by tests/test_package.py); `table`
the bucket tables (`limiter.table(name, shards)`); `http` what the HTTP middlewares share,
`asgi`, `wsgi` and `django` the middlewares and route decorators.
"""

from ._core import (CLOSED_RETRY_AFTER_MS, FUNCTIONS_VERSION, Charge, Decision, Error, Limit,
                    MisconfiguredError, ModuleMissingError, MultiDecision, Refund,
                    ReservationNotOpenError)
from ._slots import SlotItem, SlotOutcome, SlotsDecision, key_slot
from .bucket import DebtTooLongError
from .client import Limiter, connect, connect_cluster, load_functions
from .hold import LeaseTimeoutError
from .lease import Lease, LeaseCount, Reservation
from .table import AsyncTable, Table, shard_of
from .wait import WaitCancelledError, WaitNeverError, WaitTimeoutError

__all__ = ["Limiter", "Limit", "Decision", "MultiDecision", "Refund", "Charge", "Error",
           "DebtTooLongError",
           "MisconfiguredError", "ModuleMissingError", "CLOSED_RETRY_AFTER_MS", "connect",
           "connect_cluster", "load_functions", "FUNCTIONS_VERSION",
           "SlotItem", "SlotOutcome", "SlotsDecision", "key_slot",
           "WaitTimeoutError", "WaitNeverError", "WaitCancelledError",
           "Table", "AsyncTable", "shard_of",
           "Lease", "LeaseCount", "LeaseTimeoutError", "Reservation", "ReservationNotOpenError"]
__version__ = "0.1.0"
