-- redis-rl fallback for servers without the module: RL.ACQUIRE, RL.PEEK, RL.REFUND,
-- RL.CHARGE, RL.ACQUIRE.MULTI, the leases (RL.LEASE, RL.RELEASE, RL.RENEW, RL.LEASES) and the
-- reservations (RL.RESERVE, RL.SETTLE) as one script, on the server's clock, with the
-- module's replies.
-- Every client library ships this same file (clients/lua/rl.lua) and the Functions library
-- made from it (clients/lua/rl_functions.lua, written by clients/lua/functions.py from the
-- part between the two `@core` lines below, so a fix lands in both). The script is run with
-- EVALSHA, and with EVAL after NOSCRIPT:
--
--   EVALSHA sha N key1 .. keyN  mode  [10 numbers per key, packed in one argument or as texts]
--   EVALSHA sha 1 key  <80 bytes>       (the short form: a one-key acquire, packed, no mode,
--                                        answered packed: see below)
--
-- The library registers one function per mode (rl_acquire, rl_peek, rl_refund, rl_charge,
-- rl_multi, rl_lease, rl_release, rl_renew, rl_leases, rl_reserve, rl_settle) taking the same
-- keys and arguments without the mode, rl_acquire_packed (a one-key acquire answered as the
-- short form answers it: what the libraries send), and rl_version (5 since
-- rl_acquire_packed, 4 since buckets are stored packed, 3 since the packed numbers, 2 since
-- the leases and reservations; a library answering 1 has neither, and a client needing a
-- later one uses the script):
--
--   FCALL rl_acquire N key1 .. keyN  [10 numbers per key, packed in one argument or as texts]
--   FCALL rl_acquire_packed 1 key <80 bytes>
--
-- mode: "acquire" or "peek" (N = 1: reply {allowed, remaining, retry_after_ms,
-- reset_after_ms}; a peek's remaining is the signed balance, negative while in debt; the
-- short form answers the same four numbers packed, as one string of 32 bytes, four
-- little-endian doubles, and an error as an error),
-- "refund" (N = 1: reply {remaining, reset_after_ms}), "charge" (N = 1: reply {1, balance,
-- retry_after_ms, reset_after_ms}, see below), "multi" (N >= 1: reply {allowed,
-- refused_index, retry_after_ms, {per-key replies}}, all or nothing).
--
-- Leases and reservations, one key each (arguments after the key, the mode first in the
-- script form; replies are the module's commands' replies, element for element):
--
--   lease    limit ttl_ms id                    RL.LEASE:   {1, id, in_use, expires_in_ms}
--                                                           or {0, "", in_use, retry_after_ms}
--   release  id                                 RL.RELEASE: 1 or 0 (rl_release is allow-oom,
--                                                           as RL.RELEASE runs past maxmemory)
--   renew    id ttl_ms                          RL.RENEW:   1 or 0
--   leases   limit                              RL.LEASES:  {in_use, retry_after_ms}; writes
--                                                           nothing (rl_leases is no-writes)
--   reserve  <10 numbers> ttl_ms id             RL.RESERVE: {allowed, id, remaining,
--                                                           retry_after_ms}
--   settle   <10 numbers> id                    RL.SETTLE:  {balance, retry_after_ms,
--                                                           reset_after_ms}
--
-- The id is always given: a script draws no randomness, so a client sends 16 lowercase hex
-- characters from its own CSPRNG when its caller named none (1 to 16 bytes). limit is an
-- integer from 1 to 10000, ttl_ms from 1 to 3153600000000, as the module takes them, with
-- its error texts. A reserve's 10 numbers are an acquire's for (rate, capacity, estimate)
-- (K = estimate x T rounded up; an estimate of 0 is refused), a settle's are a charge's for
-- (rate, capacity, actual): K = actual x T rounded UP, as a charge rounds. The settle's net
-- effect is then exactly `actual` taken, rounded up: never more lenient than the module.
-- Where the limit is exact (below) the rounding changes nothing. A table's bucket is a key of
-- its own on the fallback (name:{i}:field), so a table's reserve and settle are these calls
-- on that key.
--
-- A lease key is a sorted set: member = id, score = the absolute expiry in µs since the
-- epoch. A lease counts while now < its expiry; writes first drop the expired ones
-- (ZREMRANGEBYSCORE -inf now), then leave the key expiring (PEXPIREAT) with its latest
-- lease, rounded up to the ms; the server deletes a set left empty. Denials, a take answered
-- as held (a retried id: its current expiry, nothing changed) and counting write nothing.
--
-- A reservation is recorded in its bucket's hash as the field "r:<id>" whose value is
-- "Kq Kr D Tq Tr expires_at_us": what the reserve took (K over D, at the limit's T = Tq
-- Tr) and when the record lapses. A bucket stored as a string (below) is turned into a hash
-- by the reserve that writes its first record (DEL, then HSET of a, b, d and the record, and
-- PEXPIREAT at the bucket's full instant, the expiry the string had moved to); a hash stays
-- a hash, also once its last record is settled (every bucket call reads and writes it in
-- place). At most 1000 are open per key. A settle gives back K_res -
-- K_actual (capped at the capacity, as a refund; a bucket left full is deleted, records and
-- all, as the module deletes it) or charges K_actual - K_res (as a charge, into debt, with its
-- bound and error: the record then stays open), and removes the record in the same call, so
-- it applies once; an unknown, settled or lapsed id is the module's error. A record whose
-- limit differs from the settle's (T or D changed: the rate changed in between) cannot be
-- re-priced by the script: that settle gives nothing back and charges the whole actual, the
-- strict side. Unsettled records lapse (their tokens stay taken) and are dropped at the
-- key's next reserve or settle; every other bucket call keeps them, and they go with the
-- key when it expires (full again).
--
-- A charge (RL.CHARGE) is post-paid: it always applies, moving the instant to
-- max(full, now) + cost * T even past the capacity, so the bucket may go below zero (debt).
-- Its balance is the tokens after it rounded toward -infinity (negative in debt), its
-- retry_after_ms the wait until the debt is repaid (0 when not in debt). While in debt every
-- acquire is denied, cost 0 included. The bucket must be full again within 100 years of now
-- (and, for the script's doubles, the instant below 2^53 us, in 2255); past that the reply
-- is an error and nothing is written. A balance below -2^53 tokens is rounded (doubles).
--
-- Lua numbers are doubles, so all arithmetic here is on integers below 2^53, where doubles
-- are exact. Time is counted in microseconds plus a remainder numerator over an integer
-- denominator D < 2^31: a duration is a pair (q, r) meaning q + r/D microseconds, 0 <= r < D.
-- The client turns the limit into such pairs with exact rational arithmetic, so that this
-- script only adds, compares and multiplies by integers. Per key, the 10 numbers are:
--
--   D          the denominator (1 <= D < 2^31)
--   Tq Tr      T = 1e6 / rate: microseconds per token (Tq <= 1e12)
--   Cq Cr      capacity * T, rounded down: the refill time of a full bucket (<= 3153600000 s)
--   Sq Sr      (capacity - cost) * T, rounded down; Sq = -1 when cost > capacity (never
--              possible; a charge does not read them)
--   Kq Kr      cost * T: rounded up for acquire, peek, charge and multi, down for refund
--              (a refund gives back at most Cq Cr, the capacity, as the module does)
--   Cfloor     floor(capacity)
--
-- A client sends them packed: one argument of 80 bytes per key, the ten in this order as
-- little-endian IEEE doubles (struct.pack('<dddddddddd', ...); each is an integer below 2^53,
-- so exact), read with one call of Redis's built-in struct library. Or, the older form, as ten
-- decimal texts per key. A call whose first number argument is 80 bytes long is packed for all
-- its keys (no decimal text is that long; each key then has one argument, so a reserve's
-- ttl_ms and id, and a settle's id, follow that one); any other call is read as texts.
--
-- The rate, capacity and cost are the exact values the module reads from the same call's
-- text: decimals ("0.1" is one tenth) and N/S rates ("100/60" is five thirds per second).
-- When T = 1e6 / rate has a reduced denominator below 2^31, D is that denominator and T is
-- exact. That holds for every decimal rate of at most 9 significant digits (0.1, 0.3, 2.5,
-- 999999937) and every N/S whose N has at most 9 and whose S has at most 6 decimal places
-- (100/60, 3/10, 7/3, 1/86400), because the denominator of 1e6/rate then divides N's digits.
-- The products (capacity, cost, capacity - cost) x T are exact too when they are whole
-- multiples of 1/D µs: always for integer capacities and costs, and for decimal ones with no
-- finer part (a cost of 0.1 at 3/s is 100000/3 µs, over D = 3: exact). There the script
-- decides exactly as the module: same allowed, remaining, retry_after_ms and reset_after_ms
-- for the same calls at the same instants (clients/vectors/bucket.json, run in lua5.1 by the
-- libraries' tests, checks it). Otherwise the client rounds in the strict direction only:
-- T up to a multiple of 2^-30 µs (D = 2^30: stricter by at most 2^-30 µs of refill per token,
-- for rates with 10 or more significant digits such as 0.016666666666666666), each product
-- the way that makes the script stricter (cost x T up, the slack and the capacity's refill
-- down) by less than 1/D µs per call. It is never more lenient than the module.
--
-- A bucket is a string of 26 bytes, "rl" and three little-endian doubles q, r and D: the
-- instant (q + r/D µs since the epoch) when it is full, each a whole number (q below 2^53, D
-- below 2^31, r below D), packed and read back by one struct call each (no number printed or
-- parsed), written with one SET that also sets the key's absolute expiry
-- (PXAT) at that instant rounded up to the millisecond. A hash {a = q, b = r, d = D}, the form
-- earlier versions wrote and the form of a bucket holding reservation records (fields "r:",
-- above), is still read (load_hash) and written back as a hash (store_hash), so a hash's
-- fields beside a, b and d (its records) stay; it expires as the string does. Any other value
-- is WRONGTYPE. A missing key is a full bucket. Denials, peeks and cost 0 write nothing. A
-- refund or settle that leaves the bucket full deletes the key (DEL), open records and all,
-- as the module deletes a full bucket with its reservations (their tokens are all back by
-- then). The commands it runs: TIME, GET, SET, and for a hash HMGET, HSET, PEXPIREAT; DEL for
-- a refund or settle that fills the bucket and for a string turned into a hash; HGET,
-- HGETALL, HDEL for the records. A bucket is read with GET under redis.pcall: on a hash GET
-- answers WRONGTYPE, which the script takes as "read it as a hash" (HMGET). Each such read
-- still counts as a failed GET in INFO (cmdstat_get failed_calls, errorstat_WRONGTYPE):
-- once on the general path, twice for a one-key acquire or peek (the fast path's GET, then
-- the general path's). No cheaper check exists: TYPE would cost every string bucket, the
-- common case, a second command.
--
-- What makes it fast: a one-key acquire or peek, the call an application makes all the time,
-- takes a short path that is the script's own top level (EVALSHA runs the script's body on
-- every call, so a function defined there, its closure and upvalues, would be made again each
-- time: the fast path makes and calls none, and the general path's functions are made only for
-- a call that needs them; the Functions library has the same lines as the body of `run`), reads
-- the packed numbers with one struct.unpack straight into its locals (Redis makes a Lua string
-- and a table slot for each argument, and strtod would convert each text; the text form is
-- still read there, by a function made only for it, each number converted once, and the
-- Functions library keeps the texts it has read), reads the bucket with one GET and one
-- struct.unpack, counts tokens with one float division settled by exact comparisons, and
-- writes the value (one struct.pack) and its expiry in one SET whose expiry text
-- string.format('%d') makes (Redis 7.0 prints a number passed to redis.call with '%.17g',
-- several times the cost, and tostring or `..` with '%.14g', about twice a %d). Every other
-- call, and any case that path does not take as plain (a hash, a rate changed, a peek in
-- debt), goes to the general path, which decides as the exact bucket does. The libraries send
-- a one-key acquire in the short form (the packed numbers, no mode: Redis then makes one Lua
-- string and one ARGV slot fewer) and read its reply packed (one bulk string, no table). Per
-- allowed call with packed numbers (callgrind, Redis 7.0.15) the script's short form runs
-- about 52,000 instructions at 10/s and 3/s on new keys and 55,500 updating a key, the
-- Functions library's rl_acquire_packed 50,500 and 54,400 (rl_acquire, answering a table,
-- 54,300 and 57,800), the classic float script 59,000 and 61,500.

if not redis.REDIS_VERSION_NUM and redis.replicate_commands then
  -- Redis < 7 replicates scripts verbatim unless told otherwise; 7+ (which has
  -- REDIS_VERSION_NUM) always replicates effects.
  pcall(redis.replicate_commands)
end

-- The call's mode, keys and arguments, as the core's per-call part (below) names them. A call
-- whose only argument is 80 bytes long (one key's packed numbers; no mode is that long) is an
-- acquire without its mode: the short form the libraries send for a one-key acquire. Its
-- reply is packed too (packed_reply): the four numbers as four little-endian doubles, which
-- Redis sends as one bulk string of 32 bytes, where a table of four integers costs it about
-- 3,500 instructions more (Redis 7.0 probes a table for its special fields, err, ok and the
-- rest, before reading its elements). The Functions library's rl_acquire_packed answers
-- the same way; its other functions answer tables, as the module.
local mode, keys, args, off, packed_reply = ARGV[1], KEYS, ARGV, 1, false
if mode and #mode == 80 and not ARGV[2] then mode, off, packed_reply = 'acquire', 0, true end

-- @core begin: shared with the Functions library, word for word (but for the `@run` lines).

-- The general path, made on first need by the per-call part below (a script call on the fast
-- path builds none of its functions; the Functions library builds them once).
local general

-- Numbers of the text form already read, by their text (m[0] counts them), or nil: the
-- Functions library keeps one (an application sends the same limit on every call), emptied past
-- 4096 entries; a script call starts afresh, so has none.
local known

-- One call: `mode` over `keys`, with the numbers in `args` after its first `off` entries,
-- answered packed when `packed_reply`. The lines from here to `@run end` are the script's own
-- top level, run by every EVALSHA with no function made or called for them; the library has
-- them as the body of its function `run(mode, keys, args, off, packed_reply)` (functions.py
-- turns the two `@run` lines into its first and last; only rl_acquire_packed passes
-- packed_reply).
-- @run begin
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2] -- TIME's two integers, each converted once
  -- The fast path: one acquire or peek. It inlines its arithmetic (a script's body makes its
  -- functions again on every call, so it has few). A `break` leaves it, with nothing written,
  -- for the general path: an argument or a stored field that is not a plain case, a rate
  -- changed since the bucket was written, a peek in debt, an estimate off by more than one
  -- token. The expiry's text is made by string.format('%d') (redis.call would print a number
  -- with "%.17g" before Redis 7.2, several times the cost).
  if (mode == 'acquire' or mode == 'peek') and #keys == 1 then repeat
    local key, take = keys[1], mode == 'acquire'
    -- The numbers: packed (one argument of 80 bytes, ten doubles read by one C call straight
    -- into these locals), or ten texts (the older form, slower: Redis makes ten Lua strings,
    -- each then converted, by a function made only for them).
    local s = args[off + 1]
    local d, tq, tr, cq, cr, sq, sr, kq, kr, cap = (s and #s == 80 and struct.unpack or function()
      -- Ten texts, each converted once (`s + 0` converts as tonumber does, which converts it
      -- twice, and raises on one that is not a number: then ten NaNs, which the checks below
      -- send to the general path, which answers). The Functions library keeps those it has
      -- read by their text (`known`).
      local function texts(a, o)
        local m = known
        if m then
          local n1, n2, n3, n4, n5 = m[a[o + 1]], m[a[o + 2]], m[a[o + 3]], m[a[o + 4]], m[a[o + 5]]
          local n6, n7, n8, n9, n10 = m[a[o + 6]], m[a[o + 7]], m[a[o + 8]], m[a[o + 9]],
            m[a[o + 10]]
          if n1 and n2 and n3 and n4 and n5 and n6 and n7 and n8 and n9 and n10 then
            return n1, n2, n3, n4, n5, n6, n7, n8, n9, n10
          end
          if m[0] > 4096 then m = {[0] = 0}; known = m end
          for i = o + 1, o + 10 do
            local t = a[i]
            if m[t] == nil then m[t] = t + 0; m[0] = m[0] + 1 end
          end
        end
        return a[o + 1] + 0, a[o + 2] + 0, a[o + 3] + 0, a[o + 4] + 0, a[o + 5] + 0,
          a[o + 6] + 0, a[o + 7] + 0, a[o + 8] + 0, a[o + 9] + 0, a[o + 10] + 0
      end
      local function read(ok, ...)
        if ok then return ... end
        local nan = 0 / 0
        return nan, nan, nan, nan, nan, nan, nan, nan, nan, nan
      end
      return read(pcall(texts, args, off))
    end)('<dddddddddd', s)
    -- Whole numbers (x % 1 is in [0, 1) for a finite x, NaN otherwise), each in its range.
    if d % 1 + tq % 1 + tr % 1 + cq % 1 + cr % 1 + sq % 1 + sr % 1 + kq % 1
        + kr % 1 + cap % 1 ~= 0 or d < 1 or tq < 0 or tr < 0 or tr >= d
        or (tq == 0 and tr == 0) or cq < 0 or cr < 0 or cr >= d or sr < 0 or sr >= d
        or kq < 0 or kr < 0 or kr >= d or cap < 0 or d >= 2147483648 then
      break
    end
    -- A plain bucket is a string; a hash (an older bucket, or one holding more than the
    -- bucket) answers an error here and goes to the general path.
    local v = redis.pcall('GET', key)
    -- How far from full the bucket is: (dq, dr), 0 when missing or full.
    local dq, dr = 0, 0
    if v then
      -- "rl" (27762) and three doubles, whole numbers in range, over this call's D. A hash
      -- answers GET with an error table, whose length is 0.
      if #v ~= 26 then break end
      local m, fq, fr, sd = struct.unpack('<Hddd', v)
      if m ~= 27762 or sd ~= d or fq % 1 + fr % 1 ~= 0 or fq < 0 or fq > 9007199254740991
          or fr < 0 or fr >= d then
        break
      end
      if fq > now or (fq == now and fr > 0) then dq, dr = fq - now, fr end
    end
    -- Milliseconds are ceil((q + r/D) / 1000), as (q - rest) / 1000, plus 1 if anything is
    -- left; q % 1000 may come out below 0 (never at or above 1000) when q / 1000 rounds up.
    local wait, taken = 0, false
    if sq < 0 then
      wait = -1 -- a cost above the capacity: never
    elseif dq > sq or (dq == sq and dr > sr) then
      local wq, wr = dq - sq, dr - sr -- the wait: debt - S
      if wr < 0 then wq = wq - 1; wr = wr + d end
      local rest = wq % 1000
      if rest < 0 then rest = rest + 1000 end
      wait = (wq - rest) / 1000
      if rest > 0 or wr > 0 then wait = wait + 1 end
    elseif take and (kq > 0 or kr > 0) then
      -- Taken: full moves to max(full, now) + K, the debt to debt + K.
      dq, dr = dq + kq, dr + kr
      if dr >= d then dq = dq + 1; dr = dr - d end
      taken = true
    end
    -- floor(tokens) at the reply's debt: the largest k <= cap with k * T <= A = C - debt, 0
    -- beyond the capacity (an acquire; a peek there reports the debt, which the general path
    -- counts). One float estimate, settled by exact comparisons with k * T and (k + 1) * T;
    -- k * tr must stay below 2^52, so that it and its quotient's product are exact.
    local k = 0
    if dq < cq or (dq == cq and dr <= cr) then
      local aq, ar = cq - dq, cr - dr
      if ar < 0 then aq = aq - 1; ar = ar + d end
      k = (aq + ar / d) / (tq + tr / d)
      k = k - k % 1
      if k > cap then k = cap end
      if k < 0 then k = 0 end
      local p = k * tr
      if p >= 4503599627370496 then break end
      local r = p % d
      if r < 0 then r = r + d end
      local q = (p - r) / d + k * tq
      if q >= 4503599627370496 then break end
      if q > aq or (q == aq and r > ar) then
        -- k * T > A: one token fewer must fit.
        k = k - 1
        q, r = q - tq, r - tr
        if r < 0 then q = q - 1; r = r + d end
        if k < 0 or q > aq or (q == aq and r > ar) then break end
      elseif k < cap then
        q, r = q + tq, r + tr
        if r >= d then q = q + 1; r = r - d end
        if q < aq or (q == aq and r <= ar) then
          -- (k + 1) * T <= A: one token more fits, and no second.
          k = k + 1
          q, r = q + tq, r + tr
          if r >= d then q = q + 1; r = r - d end
          if k < cap and (q < aq or (q == aq and r <= ar)) then break end
        end
      end
    elseif not take then
      break
    end
    if taken then
      local q = dq + now
      if q > 9007199254740991 then break end
      local rest = q % 1000
      if rest < 0 then rest = rest + 1000 end
      local at = (q - rest) / 1000
      if rest > 0 or dr > 0 then at = at + 1 end
      -- The value (packed: no number printed) and its expiry in one write; %d prints a whole
      -- double below 2^53 exactly.
      redis.call('SET', key, struct.pack('<Hddd', 27762, q, dr, d), 'PXAT',
        string.format('%d', at))
    end
    local rest = dq % 1000
    if rest < 0 then rest = rest + 1000 end
    local reset = (dq - rest) / 1000
    if rest > 0 or dr > 0 then reset = reset + 1 end
    if packed_reply then return struct.pack('<dddd', wait == 0 and 1 or 0, k, wait, reset) end
    return {wait == 0 and 1 or 0, k, wait, reset}
  until true end
  if not general then
    general = (function()
      local P21 = 2097152 -- 2^21
      local P42 = P21 * P21

      -- floor(k * m / d) and (k * m) mod d, exactly, for integers 0 <= k < 2^53, 0 <= m, d < 2^31.
      -- k is cut into three 21-bit limbs, so every intermediate stays below 2^53.
      local function muldiv(k, m, d)
        local k2 = math.floor(k / P42)
        local rest = k - k2 * P42
        local k1 = math.floor(rest / P21)
        local k0 = rest - k1 * P21
        -- One step of long division per limb, high to low (unrolled: no table per call).
        local t = k2 * m
        local q = math.floor(t / d)
        local r = t - q * d
        if r < 0 then q = q - 1; r = r + d elseif r >= d then q = q + 1; r = r - d end
        t = r * P21 + k1 * m
        local qd = math.floor(t / d)
        r = t - qd * d
        if r < 0 then qd = qd - 1; r = r + d elseif r >= d then qd = qd + 1; r = r - d end
        q = q * P21 + qd
        t = r * P21 + k0 * m
        qd = math.floor(t / d)
        r = t - qd * d
        if r < 0 then qd = qd - 1; r = r + d elseif r >= d then qd = qd + 1; r = r - d end
        return q * P21 + qd, r
      end

      -- ceil((q + r/D) / 1000) for q >= 0: a duration in µs to whole milliseconds, rounded up.
      local function ceil_ms(q, r)
        local f = math.floor(q / 1000)
        local rest = q - f * 1000
        if rest < 0 then f = f - 1; rest = rest + 1000 elseif rest >= 1000 then f = f + 1; rest = rest - 1000 end
        if rest > 0 or r > 0 then return f + 1 end
        return f
      end

      local function less_eq(aq, ar, bq, br)
        return aq < bq or (aq == bq and ar <= br)
      end

      local function add(aq, ar, bq, br, d)
        local q, r = aq + bq, ar + br
        if r >= d then q = q + 1; r = r - d end
        return q, r
      end

      local function sub(aq, ar, bq, br, d)
        local q, r = aq - bq, ar - br
        if r < 0 then q = q - 1; r = r + d end
        return q, r
      end

      local function int(s) -- for HSET and PEXPIREAT: tostring would print 5e+15
        return string.format('%.0f', s)
      end

      -- The server's time in microseconds, read once per call by `run`.
      local now_q

      -- How many arguments hold a key's numbers: 1 when packed (the first is 80 bytes long, as
      -- no decimal text is), else 10.
      local function stride_of(a, off)
        local first = a[off + 1]
        if first and #first == 80 then return 1 end
        return 10
      end

      -- The limit of key i, from the call's arguments `a`, whose first `off` are not numbers:
      -- the i-th packed argument, or the i-th run of ten texts.
      local function limit_of(a, off, i)
        if stride_of(a, off) == 1 then
          local s = a[off + i]
          if not s or #s ~= 80 then
            return redis.error_reply('ERR redis-rl script: argument ' .. (off + i)
              .. ' is not 10 packed numbers (80 bytes)')
          end
          local d, tq, tr, cq, cr, sq, sr, kq, kr, cfloor = struct.unpack('<dddddddddd', s)
          return {d = d, tq = tq, tr = tr, cq = cq, cr = cr, sq = sq, sr = sr, kq = kq, kr = kr,
                  cfloor = cfloor}
        end
        local base = off + (i - 1) * 10
        for j = base + 1, base + 10 do
          if tonumber(a[j]) == nil then
            return redis.error_reply('ERR redis-rl script: argument ' .. j .. ' is not a number')
          end
        end
        return {d = tonumber(a[base + 1]), tq = tonumber(a[base + 2]), tr = tonumber(a[base + 3]),
                cq = tonumber(a[base + 4]), cr = tonumber(a[base + 5]), sq = tonumber(a[base + 6]),
                sr = tonumber(a[base + 7]), kq = tonumber(a[base + 8]), kr = tonumber(a[base + 9]),
                cfloor = tonumber(a[base + 10])}
      end

      -- The bucket's three texts (q, r, D) in a hash's fields a, b and d, or nil when the hash
      -- has no field a. The hash form: a bucket written before the string form, or one whose
      -- hash holds more than the bucket (those fields stay; see store_hash).
      local function load_hash(key)
        local h = redis.call('HMGET', key, 'a', 'b', 'd')
        if not h[1] then return nil end
        return h[1], h[2], h[3]
      end

      -- The bucket's three numbers from its string ("rl", then q, r and D as little-endian
      -- doubles, each a whole number in range), with false for a missing key, nil for another
      -- string, or nil and true when the key is not a string (a hash: read it with load_hash).
      local function load_string(key)
        local v = redis.pcall('GET', key)
        if type(v) == 'table' then return nil, true end
        if not v then return false end
        if #v ~= 26 then return nil end
        local m, q, r, d = struct.unpack('<Hddd', v)
        if m ~= 27762 or q % 1 + r % 1 + d % 1 ~= 0 or q < 0 or q > 9007199254740991 or d < 1
            or d > 2147483647 or r < 0 or r >= d then
          return nil
        end
        return q, r, d
      end

      -- The stored instant of key, as {q, r, hash = whether a hash holds it} over lim.d, or nil
      -- for a missing key, then whether the key is a hash. A hash without the bucket's field a
      -- is someone else's (this script writes a, b and d with every record): WRONGTYPE, as the
      -- module answers, and nothing written over it.
      local function load(key, lim)
        local q, r, d = load_string(key)
        local hash = r == true
        if q == false then return nil, false end
        if q == nil and not hash then
          -- Someone else's string: the server's own WRONGTYPE, raised by HMGET as it raised it
          -- before the string form (the module answers the same error; a raised error carries
          -- the script's name, which the libraries show). Nothing is written before this.
          redis.call('HMGET', key, 'a')
          return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
        end
        if hash then
          q, r, d = load_hash(key)
          if q == nil then
            return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
          end
        end
        q, r, d = tonumber(q), tonumber(r), tonumber(d)
        if q == nil or r == nil or d == nil or d < 1 or r < 0 or r >= d then
          return redis.error_reply('ERR redis-rl script: ' .. key .. ' holds no bucket state')
        end
        if d ~= lim.d then
          -- The rate changed: re-express r over the new denominator, rounding up (later = stricter).
          local nr, rem = muldiv(r, lim.d, d)
          if rem > 0 then nr = nr + 1 end
          if nr >= lim.d then q = q + 1; nr = nr - lim.d end
          r = nr
        end
        return {q, r, hash = hash}, hash
      end

      -- How far from full the bucket is at now: {q, r}, {0, 0} when full.
      local function debt_of(full)
        if full == nil then return 0, 0 end
        local q, r = full[1] - now_q, full[2]
        if q < 0 or (q == 0 and r == 0) then return 0, 0 end
        return q, r
      end

      -- Whether n tokens' refill time, n * T, is at most (aq, ar).
      local function fits(lim, n, aq, ar)
        local q, r = muldiv(n, lim.tr, lim.d)
        return less_eq(q + n * lim.tq, r, aq, ar)
      end

      -- floor(tokens) for a bucket `debt` short of full: the largest whole k <= floor(capacity) with
      -- k * T <= capacity * T - debt, found from a float estimate settled with exact comparisons.
      local function remaining_of(lim, dq, dr)
        if not less_eq(dq, dr, lim.cq, lim.cr) then return 0 end
        local aq, ar = sub(lim.cq, lim.cr, dq, dr, lim.d)
        local t = lim.tq + lim.tr / lim.d
        local k = math.floor((aq + ar / lim.d) / t)
        if k > lim.cfloor then k = lim.cfloor end
        if k < 0 then k = 0 end
        for _ = 1, 64 do
          if k > 0 and not fits(lim, k, aq, ar) then k = k - 1 else break end
        end
        for _ = 1, 64 do
          if k < lim.cfloor and fits(lim, k + 1, aq, ar) then k = k + 1 else break end
        end
        return k
      end

      -- Whether n tokens' refill time, n * T, is at least (aq, ar).
      local function covers(lim, n, aq, ar)
        local q, r = muldiv(n, lim.tr, lim.d)
        return less_eq(aq, ar, q + n * lim.tq, r)
      end

      -- A bucket's signed balance: remaining_of while it holds tokens, else -k for the smallest
      -- whole k with k * T >= debt - capacity * T (rounded toward -infinity), negative in debt.
      local function balance_of(lim, dq, dr)
        if less_eq(dq, dr, lim.cq, lim.cr) then return remaining_of(lim, dq, dr) end
        local oq, orr = sub(dq, dr, lim.cq, lim.cr, lim.d)
        local k = math.ceil((oq + orr / lim.d) / (lim.tq + lim.tr / lim.d))
        if k < 1 then k = 1 end
        -- muldiv is exact below 2^53 only: a debt that deep is reported as the estimate.
        if k >= P42 * 2048 then return -k end
        for _ = 1, 64 do
          if k > 1 and covers(lim, k - 1, oq, orr) then k = k - 1 else break end
        end
        for _ = 1, 64 do
          if not covers(lim, k, oq, orr) then k = k + 1 else break end
        end
        return -k
      end

      -- One acquire (or peek) decision on `full` at now. Returns the reply and the new instant, or
      -- nil when nothing is to be written. A peek reports the signed balance, an acquire what may
      -- be taken (0 while in debt).
      local function decide(lim, full, take)
        local dq, dr = debt_of(full)
        local count = take and remaining_of or balance_of
        if lim.sq < 0 then
          return {0, count(lim, dq, dr), -1, ceil_ms(dq, dr)}, nil
        end
        if not less_eq(dq, dr, lim.sq, lim.sr) then
          local wq, wr = sub(dq, dr, lim.sq, lim.sr, lim.d)
          return {0, count(lim, dq, dr), ceil_ms(wq, wr), ceil_ms(dq, dr)}, nil
        end
        if not take or (lim.kq == 0 and lim.kr == 0) then
          return {1, count(lim, dq, dr), 0, ceil_ms(dq, dr)}, nil
        end
        local bq, br = now_q, 0
        if dq > 0 or dr > 0 then bq, br = full[1], full[2] end
        local nq, nr = add(bq, br, lim.kq, lim.kr, lim.d)
        local new = {nq, nr}
        local ndq, ndr = debt_of(new)
        return {1, remaining_of(lim, ndq, ndr), 0, ceil_ms(ndq, ndr)}, new
      end

      -- Writes the bucket as a hash's fields a, b and d, leaving its other fields.
      local function store_hash(key, lim, full)
        redis.call('HSET', key, 'a', int(full[1]), 'b', int(full[2]), 'd', int(lim.d))
        redis.call('PEXPIREAT', key, int(ceil_ms(full[1], full[2])))
      end

      -- Writes the bucket as its string ("rl" and q, r, D packed) with its expiry, in one SET.
      local function store_string(key, lim, full)
        redis.call('SET', key, struct.pack('<Hddd', 27762, full[1], full[2], lim.d),
          'PXAT', int(ceil_ms(full[1], full[2])))
      end

      -- Writes `full` in the form `old` (what load read) had: a hash stays a hash (an older
      -- bucket until it expires, or one whose hash holds more than the bucket), anything else
      -- becomes the string.
      local function store(key, lim, full, old)
        if old and old.hash then
          store_hash(key, lim, full)
        else
          store_string(key, lim, full)
        end
      end

      -- The charge's bound: full again within 100 years of now (3153600000 s, in us), and an
      -- instant below 2^53 us, where the script's doubles stay exact.
      local MAX_DEBT_US = 3153600000 * 1000000
      local MAX_INSTANT_US = P42 * 2048
      local ERR_DEBT = 'ERR cost would leave the bucket in debt for more than 100 years '
        .. '(it must be full again within 3153600000 s, and before 2262)'

      -- A charge's reply for a bucket `debt` short of full: {1, balance, until repaid, until full}.
      local function charged(lim, dq, dr)
        local repaid = 0
        if not less_eq(dq, dr, lim.cq, lim.cr) then
          repaid = ceil_ms(sub(dq, dr, lim.cq, lim.cr, lim.d))
        end
        return {1, balance_of(lim, dq, dr), repaid, ceil_ms(dq, dr)}
      end

      -- Leases (RL.LEASE, RL.RELEASE, RL.RENEW, RL.LEASES): a sorted set per key, member = id,
      -- score = absolute expiry in µs (exact: below 2^53 until the year 2255). A lease counts
      -- while now < its expiry. Writes drop the expired ones first and leave the key expiring
      -- (PEXPIREAT) with its latest lease, rounded up to the ms; a set left empty is deleted by
      -- the server. Denials, a take answered as held, and counting write nothing.
      local MAX_LEASE_LIMIT = 10000
      local MAX_TTL_MS = 3153600000000
      local ERR_LIMIT = 'ERR limit must be an integer from 1 to 10000 (leases)'
      local ERR_TTL = 'ERR ttl_ms must be an integer from 1 to 3153600000000 (ms)'
      local ERR_ID = 'ERR id must be 1 to 16 bytes'

      -- An argument that must be a plain decimal integer from 1 to max (the module's reading:
      -- digits only, no sign), or nil.
      local function whole(s, max)
        if type(s) ~= 'string' or not string.find(s, '^%d+$') then return nil end
        local n = tonumber(s)
        if n < 1 or n > max then return nil end
        return n
      end

      local function valid_id(id)
        return type(id) == 'string' and #id >= 1 and #id <= 16
      end

      -- The leases of key counting now.
      local function leases_live(key)
        return redis.call('ZCOUNT', key, '(' .. int(now_q), '+inf')
      end

      -- µs until a slot frees under limit with in_use leases counting: 0 below the limit, else
      -- until the lease whose expiry brings the count under it (the (in_use - limit)-th live one).
      local function lease_wait(key, limit, in_use)
        if in_use < limit then return 0 end
        local r = redis.call('ZRANGEBYSCORE', key, '(' .. int(now_q), '+inf', 'WITHSCORES',
          'LIMIT', int(in_use - limit), 1)
        if not r[2] then return 0 end
        return tonumber(r[2]) - now_q
      end

      -- The expiry of a held lease (a number), or nil when id is not held now.
      local function lease_held(key, id)
        local at = redis.call('ZSCORE', key, id)
        if at then
          at = tonumber(at)
          if at > now_q then return at end
        end
        return nil
      end

      -- After a write: the key expires with its latest lease (a set left empty is gone).
      local function lease_expiry(key)
        local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        if last[2] then redis.call('PEXPIREAT', key, int(ceil_ms(tonumber(last[2]), 0))) end
      end

      local function lease_call(mode, key, a, off)
        if mode == 'leases' then
          local limit = whole(a[off + 1], MAX_LEASE_LIMIT)
          if not limit then return redis.error_reply(ERR_LIMIT) end
          local in_use = leases_live(key)
          return {in_use, ceil_ms(lease_wait(key, limit, in_use), 0)}
        end
        if mode == 'lease' then
          local limit = whole(a[off + 1], MAX_LEASE_LIMIT)
          if not limit then return redis.error_reply(ERR_LIMIT) end
          local ttl = whole(a[off + 2], MAX_TTL_MS)
          if not ttl then return redis.error_reply(ERR_TTL) end
          local id = a[off + 3]
          if not valid_id(id) then return redis.error_reply(ERR_ID) end
          local in_use = leases_live(key)
          local at = lease_held(key, id)
          if at then return {1, id, in_use, ceil_ms(at - now_q, 0)} end
          if in_use >= limit then
            return {0, '', in_use, ceil_ms(lease_wait(key, limit, in_use), 0)}
          end
          redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_q))
          redis.call('ZADD', key, int(now_q + ttl * 1000), id)
          lease_expiry(key)
          return {1, id, in_use + 1, ttl}
        end
        -- release, renew
        local id = a[off + 1]
        if not valid_id(id) then return redis.error_reply(ERR_ID) end
        local ttl
        if mode == 'renew' then
          ttl = whole(a[off + 2], MAX_TTL_MS)
          if not ttl then return redis.error_reply(ERR_TTL) end
        end
        if not lease_held(key, id) then return 0 end
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_q))
        if ttl then
          redis.call('ZADD', key, int(now_q + ttl * 1000), id)
        else
          redis.call('ZREM', key, id)
        end
        lease_expiry(key)
        return 1
      end

      -- Reservations (RL.RESERVE, RL.SETTLE): records in the bucket's hash, beside its state,
      -- as fields "r:<id>" = "Kq Kr D Tq Tr expires_at_us" (see the header). These helpers are
      -- the only code that reads or writes them, and only on a hash: a string bucket (or a
      -- missing key) holds no record, and becomes a hash when its first record is written.
      local MAX_RESERVATIONS = 1000

      -- A record's numbers, or nil when it is missing, unreadable or lapsed (now >= expiry), or
      -- the key is not a hash (`hash` as load answered it).
      local function record_of(key, hash, id)
        if not hash then return nil end
        local text = redis.call('HGET', key, 'r:' .. id)
        if not text then return nil end
        local kq, kr, d, tq, tr, at = string.match(text, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
        if not at or tonumber(at) <= now_q then return nil end
        return {kq = tonumber(kq), kr = tonumber(kr), d = tonumber(d), tq = tonumber(tq),
                tr = tonumber(tr)}
      end

      -- The key's open records' count, and the fields of the lapsed ones (none but in a hash).
      local function records_scan(key, hash)
        if not hash then return 0, {} end
        local all = redis.call('HGETALL', key)
        local open, lapsed = 0, {}
        for i = 1, #all, 2 do
          local f = all[i]
          if string.sub(f, 1, 2) == 'r:' then
            local at = string.match(all[i + 1], ' (%d+)$')
            if at and tonumber(at) > now_q then open = open + 1 else lapsed[#lapsed + 1] = f end
          end
        end
        return open, lapsed
      end

      -- Removes the fields `gone` (lapsed records, and a settled one) from key, if it still
      -- exists.
      local function records_drop(key, gone)
        if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
      end

      -- The module's text for a settle of an id with no open record: the id's bytes outside
      -- printable ASCII, and the backslash, written \xNN.
      local function not_open(id)
        local shown = {}
        for i = 1, #id do
          local b = string.byte(id, i)
          if b > 32 and b < 127 and b ~= 92 then shown[i] = string.char(b)
          else shown[i] = string.format('\\x%02x', b) end
        end
        return redis.error_reply('ERR id ' .. table.concat(shown)
          .. ' is not an open reservation of this key (settled, expired or never made)')
      end

      local function reserve_call(mode, key, a, off)
        local lim = limit_of(a, off, 1)
        if lim.err then return lim end
        local n = stride_of(a, off) -- the ttl and the id follow the numbers
        if mode == 'reserve' then
          if lim.kq == 0 and lim.kr == 0 then
            return redis.error_reply('ERR estimate must be a number above 0 (tokens)')
          end
          local ttl = whole(a[off + n + 1], MAX_TTL_MS)
          if not ttl then return redis.error_reply(ERR_TTL) end
          local id = a[off + n + 2]
          if not valid_id(id) then return redis.error_reply(ERR_ID) end
          local full, hash = load(key, lim)
          if full and full.err then return full end
          if record_of(key, hash, id) then
            -- A retry of an open reservation: the bucket as it is, nothing taken (a peek of
            -- 0 tokens, as the module answers it, denied only while in debt).
            local zero = {d = lim.d, tq = lim.tq, tr = lim.tr, cq = lim.cq, cr = lim.cr,
                          sq = lim.cq, sr = lim.cr, kq = 0, kr = 0, cfloor = lim.cfloor}
            local reply = decide(zero, full, true)
            if reply[1] == 1 then return {1, id, reply[2], 0} end
            return {0, '', reply[2], reply[3]}
          end
          local open, lapsed = records_scan(key, hash)
          if open >= MAX_RESERVATIONS then
            return redis.error_reply('ERR a key holds at most 1000 open reservations, each id once')
          end
          local reply, new = decide(lim, full, true)
          if reply[1] == 0 or not new then return {0, '', reply[2], reply[3]} end
          -- The record goes beside the bucket's fields in its hash: a string bucket is replaced
          -- by the hash (DEL, then HSET of a, b and d), and store_hash sets the key's absolute
          -- expiry, the new full instant, as the string carried it.
          if not hash and full then redis.call('DEL', key) end
          store_hash(key, lim, new)
          records_drop(key, lapsed)
          redis.call('HSET', key, 'r:' .. id, int(lim.kq) .. ' ' .. int(lim.kr) .. ' ' .. int(lim.d)
            .. ' ' .. int(lim.tq) .. ' ' .. int(lim.tr) .. ' ' .. int(now_q + ttl * 1000))
          return {1, id, reply[2], 0}
        end
        -- settle
        local id = a[off + n + 1]
        if not valid_id(id) then return redis.error_reply(ERR_ID) end
        local full, hash = load(key, lim)
        if full and full.err then return full end
        local rec = record_of(key, hash, id)
        if not rec then return not_open(id) end
        local eq, er = rec.kq, rec.kr
        if rec.d ~= lim.d or rec.tq ~= lim.tq or rec.tr ~= lim.tr then eq, er = 0, 0 end
        -- The key is a hash from here on (it holds the record), and stays one: a settle writes
        -- the bucket back with store_hash, also when it removes the last record.
        local _, gone = records_scan(key, hash)
        gone[#gone + 1] = 'r:' .. id
        local dq, dr = debt_of(full)
        local reply
        if less_eq(lim.kq, lim.kr, eq, er) then
          -- Over-estimated (or exact): E - K goes back, at most the capacity, as a refund.
          local bq, br = sub(eq, er, lim.kq, lim.kr, lim.d)
          if not less_eq(bq, br, lim.cq, lim.cr) then bq, br = lim.cq, lim.cr end
          if (bq == 0 and br == 0) or (dq == 0 and dr == 0) then
            records_drop(key, gone)
            reply = charged(lim, dq, dr)
          elseif less_eq(dq, dr, bq, br) then
            redis.call('DEL', key)
            reply = charged(lim, 0, 0)
          else
            local ndq, ndr = sub(dq, dr, bq, br, lim.d)
            store_hash(key, lim, {add(now_q, 0, ndq, ndr, lim.d)})
            records_drop(key, gone)
            reply = charged(lim, ndq, ndr)
          end
        else
          -- Under-estimated: K - E is charged, as a charge, into debt.
          local cq, cr = sub(lim.kq, lim.kr, eq, er, lim.d)
          local bq, br = now_q, 0
          if dq > 0 or dr > 0 then bq, br = full[1], full[2] end
          local nq, nr = add(bq, br, cq, cr, lim.d)
          local ndq, ndr = sub(nq, nr, now_q, 0, lim.d)
          if not less_eq(ndq, ndr, MAX_DEBT_US, 0) or nq >= MAX_INSTANT_US then
            return redis.error_reply(ERR_DEBT)
          end
          store_hash(key, lim, {nq, nr})
          records_drop(key, gone)
          reply = charged(lim, ndq, ndr)
        end
        return {reply[2], reply[3], reply[4]}
      end

      -- One call: `mode` over `keys`, with the numbers in `args` after its first `off` entries, at
      -- `now` (µs).
      return function(mode, keys, args, off, now)
        now_q = now
        if mode == 'acquire' or mode == 'peek' or mode == 'refund' or mode == 'charge' then
          if #keys ~= 1 then return redis.error_reply('ERR redis-rl script: ' .. mode .. ' takes one key') end
          local lim = limit_of(args, off, 1)
          if lim.err then return lim end
          local key = keys[1]
          local full = load(key, lim)
          if full and full.err then return full end
          if mode == 'refund' then
            -- At most the capacity comes back, as the module caps it: a bucket in debt after a charge
            -- owes more than that.
            if not less_eq(lim.kq, lim.kr, lim.cq, lim.cr) then lim.kq, lim.kr = lim.cq, lim.cr end
            local dq, dr = debt_of(full)
            if dq == 0 and dr == 0 then return {remaining_of(lim, 0, 0), 0} end
            if less_eq(dq, dr, lim.kq, lim.kr) then
              redis.call('DEL', key)
              return {remaining_of(lim, 0, 0), 0}
            end
            if lim.kq == 0 and lim.kr == 0 then return {remaining_of(lim, dq, dr), ceil_ms(dq, dr)} end
            local ndq, ndr = sub(dq, dr, lim.kq, lim.kr, lim.d)
            local nq, nr = add(now_q, 0, ndq, ndr, lim.d)
            store(key, lim, {nq, nr}, full)
            return {remaining_of(lim, ndq, ndr), ceil_ms(ndq, ndr)}
          end
          if mode == 'charge' then
            local dq, dr = debt_of(full)
            if lim.kq == 0 and lim.kr == 0 then return charged(lim, dq, dr) end
            local bq, br = now_q, 0
            if dq > 0 or dr > 0 then bq, br = full[1], full[2] end
            local nq, nr = add(bq, br, lim.kq, lim.kr, lim.d)
            local ndq, ndr = sub(nq, nr, now_q, 0, lim.d)
            if not less_eq(ndq, ndr, MAX_DEBT_US, 0) or nq >= MAX_INSTANT_US then
              return redis.error_reply(ERR_DEBT)
            end
            store(key, lim, {nq, nr}, full)
            return charged(lim, ndq, ndr)
          end
          local reply, new = decide(lim, full, mode == 'acquire')
          if new then store(key, lim, new, full) end
          return reply
        elseif mode == 'multi' then
          if #keys < 1 then return redis.error_reply('ERR redis-rl script: multi takes at least one key') end
          -- Each key is read once; a key named twice sees its own earlier take (as the module does).
          local pending, order, replies = {}, {}, {}
          local refused, retry = -1, 0
          for i = 1, #keys do
            local lim = limit_of(args, off, i)
            if lim.err then return lim end
            local key = keys[i]
            if pending[key] == nil then
              local full = load(key, lim)
              if full and full.err then return full end
              pending[key] = {full = full, old = full, lim = lim, changed = false}
              order[#order + 1] = key
            end
            local p = pending[key]
            local full = p.full
            if full and p.lim.d ~= lim.d then
              -- Named twice with different rates: carry the pending instant over to this denominator.
              local nr, rem = muldiv(full[2], lim.d, p.lim.d)
              if rem > 0 then nr = nr + 1 end
              full = {full[1], nr}
              if nr >= lim.d then full = {full[1] + 1, nr - lim.d} end
            end
            local reply, new = decide(lim, full, true)
            replies[i] = reply
            if new then p.full = new; p.lim = lim; p.changed = true end
            if reply[1] == 0 then
              if refused < 0 then refused = i - 1 end
              if reply[3] < 0 or retry < 0 then retry = -1 elseif reply[3] > retry then retry = reply[3] end
            end
          end
          if refused >= 0 then return {0, refused, retry, replies} end
          for _, key in ipairs(order) do
            local p = pending[key]
            if p.changed then store(key, p.lim, p.full, p.old) end
          end
          return {1, -1, 0, replies}
        elseif mode == 'lease' or mode == 'release' or mode == 'renew' or mode == 'leases' then
          if #keys ~= 1 then return redis.error_reply('ERR redis-rl script: ' .. mode .. ' takes one key') end
          return lease_call(mode, keys[1], args, off)
        elseif mode == 'reserve' or mode == 'settle' then
          if #keys ~= 1 then return redis.error_reply('ERR redis-rl script: ' .. mode .. ' takes one key') end
          return reserve_call(mode, keys[1], args, off)
        end
        return redis.error_reply('ERR redis-rl script: unknown mode')
      end
    end)()
  end
  local reply = general(mode, keys, args, off, now)
  if packed_reply and not reply.err then
    return struct.pack('<dddd', reply[1], reply[2], reply[3], reply[4])
  end
  return reply
-- @run end
-- @core end
