"""redis-rl client: rate limits on Redis with the redis-rl module, with an explicit failure
policy, a hot-key shield and a Lua fallback for servers without the module.

    from redis_rl import Limiter, Limit, connect
    limiter = Limiter(connect("redis://127.0.0.1:6379"), on_error="local", instances=4,
                      deny_cache=True, without_module="lua")
    d = limiter.acquire("user:42", Limit(rate=5, capacity=10), cost=1)
    if not d.allowed: ...  # 429 with d.headers()
    limiter.acquire("api:42", Limit(100, per=60))  # 100 a minute, sent as 100/60

Layout: `_core` holds the types, the policy, the shield and each call's steps (no I/O);
`_decimal` the text sent for a number and its exact value; `client` the sync limiter and
`asyncio` its awaited twin (only the I/O); `bucket` the exact in-process bucket; `rl.lua` the
fallback script (a copy of clients/lua/rl.lua, kept equal by tests/test_package.py); `table`
the bucket tables (`limiter.table(name, shards)`); `http` what the HTTP middlewares share,
`asgi`, `wsgi` and `django` the middlewares and route decorators.
"""

from ._core import (CLOSED_RETRY_AFTER_MS, Charge, Decision, Error, Limit, ModuleMissingError,
                    MultiDecision, Refund)
from .bucket import DebtTooLongError
from .client import Limiter, connect, connect_cluster
from .table import AsyncTable, Table, shard_of
from .wait import WaitCancelledError, WaitNeverError, WaitTimeoutError

__all__ = ["Limiter", "Limit", "Decision", "MultiDecision", "Refund", "Charge", "Error",
           "DebtTooLongError",
           "ModuleMissingError", "CLOSED_RETRY_AFTER_MS", "connect", "connect_cluster",
           "WaitTimeoutError", "WaitNeverError", "WaitCancelledError",
           "Table", "AsyncTable", "shard_of"]
__version__ = "0.1.0"
