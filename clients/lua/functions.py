#!/usr/bin/env python3
"""Writes clients/lua/rl_functions.lua, the Functions library, from clients/lua/rl.lua.

The library is the script's core (the lines between `-- @core begin` and `-- @core end`),
word for word, under a `#!lua name=redis_rl` line, with one registered function per mode; its
per-call part, which the script runs as its own top level (so that EVALSHA makes no function
for it), is between a `-- @run begin` and a `-- @run end` line, which become the first and
last lines of the library's `local function run(mode, keys, args, off, packed_reply)` (only
rl_acquire_packed passes packed_reply: the other functions answer tables, as the module
does). So
the script and the library decide alike by construction: a fix to the core lands in both, and
the shared vectors run against both (clients/lua/harness.lua loads either).

    python3 clients/lua/functions.py           # rewrite rl_functions.lua, and the copies
    python3 clients/lua/functions.py --check   # exit 1 if it or a copy is not what rl.lua makes

Each client library ships a copy of both files (COPIES), byte for byte; this writes and checks
those too.

Bump VERSION when a function's arguments or replies change, so that clients meeting an older
library loaded on a server can tell, and say so.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "rl.lua")
LIBRARY = os.path.join(HERE, "rl_functions.lua")

#: The client libraries' directories holding a copy of rl.lua and of rl_functions.lua.
COPIES = [os.path.join(HERE, "..", *path.split("/"))
          for path in ("python/src/redis_rl", "node/src", "rust/src")]

#: The library's version, answered by FCALL_RO rl_version 0.
VERSION = 5

HEADER = """#!lua name=redis_rl
-- redis-rl's Functions library: the fallback script's decisions (clients/lua/rl.lua) as Redis
-- Functions, which the server persists and replicates, so a failover or a restart never loses
-- them and an application user needs only FCALL and FCALL_RO. Load it once, as a user allowed
-- FUNCTION LOAD (on every master of a cluster):
--
--   redis-cli -x FUNCTION LOAD REPLACE < rl_functions.lua
--
-- Functions, each with the script's keys and numbers after the mode (see rl.lua's header):
--   FCALL rl_acquire 1 key <10 numbers>      {allowed, remaining, retry_after_ms, reset_after_ms}
--   FCALL rl_acquire_packed 1 key <80 bytes> the same four numbers packed, as the script's
--                                            short form answers them (32 bytes, four
--                                            little-endian doubles): what the libraries send
--   FCALL_RO rl_peek 1 key <10 numbers>      the same, taking nothing (no-writes: replicas too)
--   FCALL rl_refund 1 key <10 numbers>       {remaining, reset_after_ms}
--   FCALL rl_charge 1 key <10 numbers>       {1, balance, retry_after_ms, reset_after_ms}
--   FCALL rl_multi N key1 .. keyN <10 numbers per key>   all or nothing
--   FCALL rl_lease 1 key limit ttl_ms id     RL.LEASE's reply
--   FCALL rl_release 1 key id                RL.RELEASE's reply
--   FCALL rl_renew 1 key id ttl_ms           RL.RENEW's reply
--   FCALL_RO rl_leases 1 key limit           RL.LEASES's reply (no-writes: replicas too)
--   FCALL rl_reserve 1 key <10 numbers> ttl_ms id      RL.RESERVE's reply
--   FCALL rl_settle 1 key <10 numbers> id    RL.SETTLE's reply
--   FCALL_RO rl_version 0                    this library's version (5: rl_acquire_packed;
--                                            4: buckets stored packed; 3: the packed
--                                            numbers; 2: leases and reservations; 1 had
--                                            neither)
--
-- <10 numbers> is one argument of 80 bytes (ten little-endian doubles, packed) or ten texts.
--
-- Written by clients/lua/functions.py from rl.lua: edit rl.lua, then run it.
"""

FOOTER = """
local VERSION = {version}

known = {{[0] = 0}}

local function mode(name, packed_reply)
  return function(keys, args) return run(name, keys, args, 0, packed_reply) end
end

redis.register_function('rl_acquire', mode('acquire'))
-- A one-key acquire answered packed, as the script's short form: Redis sends 32 bytes for
-- about 3,500 instructions less than a table of four integers.
redis.register_function('rl_acquire_packed', mode('acquire', true))
redis.register_function{{function_name = 'rl_peek', callback = mode('peek'), flags = {{'no-writes'}}}}
redis.register_function('rl_refund', mode('refund'))
redis.register_function('rl_charge', mode('charge'))
redis.register_function('rl_multi', mode('multi'))
redis.register_function('rl_lease', mode('lease'))
-- A release frees memory, as DEL does: allowed past maxmemory, as RL.RELEASE is.
redis.register_function{{function_name = 'rl_release', callback = mode('release'), flags = {{'allow-oom'}}}}
redis.register_function('rl_renew', mode('renew'))
redis.register_function{{function_name = 'rl_leases', callback = mode('leases'), flags = {{'no-writes'}}}}
redis.register_function('rl_reserve', mode('reserve'))
redis.register_function('rl_settle', mode('settle'))
redis.register_function{{function_name = 'rl_version', callback = function() return VERSION end,
  flags = {{'no-writes'}}}}
"""


def core(script):
    lines = script.split("\n")
    begin = [i for i, line in enumerate(lines) if line.startswith("-- @core begin")]
    end = [i for i, line in enumerate(lines) if line.startswith("-- @core end")]
    if len(begin) != 1 or len(end) != 1 or begin[0] >= end[0]:
        raise SystemExit("rl.lua must hold one '-- @core begin' line before one '-- @core end' line")
    body = lines[begin[0] + 1:end[0]]
    # The per-call part, the script's top level, is the body of the library's function `run`.
    run_begin = [i for i, line in enumerate(body) if line.startswith("-- @run begin")]
    run_end = [i for i, line in enumerate(body) if line.startswith("-- @run end")]
    if len(run_begin) != 1 or len(run_end) != 1 or run_begin[0] >= run_end[0]:
        raise SystemExit("rl.lua's core must hold one '-- @run begin' line before one "
                         "'-- @run end' line")
    body[run_begin[0]] = "local function run(mode, keys, args, off, packed_reply)"
    body[run_end[0]] = "end"
    return "\n".join(body) + "\n"


def library():
    with open(SCRIPT) as f:
        script = f.read()
    return HEADER + "\n" + core(script) + FOOTER.format(version=VERSION)


def main(argv):
    text = library()
    with open(SCRIPT) as f:
        script = f.read()
    files = [(LIBRARY, text)]
    for copy in COPIES:
        files += [(os.path.join(copy, "rl.lua"), script),
                  (os.path.join(copy, "rl_functions.lua"), text)]
    if "--check" in argv:
        for path, want in files:
            with open(path) as f:
                if f.read() != want:
                    shown = os.path.relpath(path, os.path.join(HERE, "..", ".."))
                    print("%s is not what clients/lua/rl.lua makes: run python3 "
                          "clients/lua/functions.py" % shown, file=sys.stderr)
                    return 1
        return 0
    for path, want in files:
        with open(path, "w") as f:
            f.write(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
