-- The classic Lua token bucket: the baseline that RL.ACQUIRE replaces.
--
-- This is the script most Redis rate limiters ship (HMGET the state, refill, take, HSET it
-- back). It is kept deliberately classic, weaknesses included, because the benchmarks
-- (EVALSHA against RL.ACQUIRE) and the parity test (tests/lua_parity.rs) measure the module
-- against exactly this. Do not "fix" it here.
--
-- Call:
--   EVALSHA <sha> 1 <key> <rate> <capacity> <now_ms> [cost]
--     KEYS[1]  the bucket, a hash with fields `tokens` and `ts`
--     ARGV[1]  rate: tokens added per second
--     ARGV[2]  capacity: the most tokens the bucket holds
--     ARGV[3]  now_ms: the current time in ms since the Unix epoch, supplied by the client
--     ARGV[4]  cost: tokens to take, 1 when absent
--   Reply: {allowed (1 or 0), floor(tokens left)}
--
-- A missing key is a full bucket. Refill is tokens + (now - ts) / 1000 * rate, capped at
-- capacity; a clock that went backwards (now < ts) refills nothing.
--
-- Known weaknesses, each one a reason for the module:
--   - Client clock: now_ms comes from the caller. Clients with skewed clocks disagree about
--     the bucket, and a client whose clock runs ahead refills it early for everyone.
--   - Float drift: refill is accumulated into a stored float on every call and the result is
--     written back as a decimal string, so rounding errors compound over many calls instead
--     of being recomputed from one exact instant.
--   - Writes on denial: every call, allowed or not, does HSET + PEXPIRE. A denied request
--     still dirties the key, costs an AOF write and a replication message, and breaks WATCH.
--   - Verbatim replication with a client-supplied time: the script takes now_ms as an
--     argument (rather than calling TIME) so that replicating the script itself, the default
--     before Redis 5, replays the same decision on replicas and from the AOF. That is
--     what ties it to the client clock. Redis 5+ replicates the script's effects instead
--     (always, from 7.0), which means every call, denials included, ships an HSET and an
--     expiry wrapped in MULTI/EXEC.
--   - Two fields in a hash per key, plus the hash's overhead, where one 64-bit instant would
--     do; and a TTL padded by a second because the refill time is only approximate.

local key = KEYS[1]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4] or 1)

local state = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  -- A missing key is a full bucket.
  tokens = capacity
  ts = now
end

if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) / 1000 * rate)
end

local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end

-- Numbers passed to redis.call become strings at full (17-digit) precision; Lua's own
-- tostring would keep only 14 digits.
redis.call('HSET', key, 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', key, math.ceil(capacity / rate * 1000) + 1000)

-- Redis truncates Lua numbers to integers in replies; floor makes that explicit.
return {allowed, math.floor(tokens)}
