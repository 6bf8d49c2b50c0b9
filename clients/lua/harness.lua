-- Runs rl.lua, or the Functions library rl_functions.lua, outside Redis, for tests: a
-- stand-in `redis` whose TIME is the time the test gives, and whose keys live in a table. A
-- file whose first line is `#!lua` is a library: each call goes to its function `rl_<mode>`,
-- without the mode among the arguments, as FCALL sends it. Reads calls from stdin, one a line:
--
--   now_us key[,key...] mode n1 .. n10 [n1 .. n10 ...]
--   now_us key[,key...] mode hex:<the ten numbers packed> [hex:... ...]
--
-- (a word hex:<digits> is those bytes: the packed form, ten little-endian doubles, which the
-- stand-in `struct` below decodes as Redis's does)
-- and prints each reply as space-separated integers (nested arrays flattened), or
-- "error <text>". Used by clients/python/tests/test_lua_vectors.py to hold the script to
-- clients/vectors/bucket.json without a server clock. With a second argument `json`, each
-- reply is printed as JSON instead (strings quoted, arrays nested, an error as
-- {"error": text}), for the lease and reservation vectors, whose replies hold ids. Keys are
-- hashes or sorted sets (a command on the other kind is the server's WRONGTYPE error); keys
-- never expire here, so vectors must not step past a key's expiry while it matters.
local script_path = arg[1]
local as_json = arg[2] == 'json'
local chunk = assert(loadfile(script_path)) -- skips a first line starting with '#'
local store, now_us = {}, 0
local is_library
do
  local f = assert(io.open(script_path))
  is_library = string.sub(f:read('*l') or '', 1, 5) == '#!lua'
  f:close()
end

-- Redis's `struct` library, as far as the script uses it (lua5.1 has none): little-endian
-- formats of 'H' (an unsigned 16-bit number) and 'd' (an IEEE double): the ten packed numbers
-- of a call, and a bucket's string ("rl" as 27762, then three doubles), encoded and decoded
-- bit for bit.
local function double_at(s, i)
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, i, i + 7)
  local sign = b8 >= 128 and -1 or 1
  local exp = (b8 % 128) * 16 + math.floor(b7 / 16)
  local mant = (((((b7 % 16) * 256 + b6) * 256 + b5) * 256 + b4) * 256 + b3) * 65536
    + b2 * 256 + b1
  if exp == 2047 then
    if mant == 0 then return sign * math.huge end
    return 0 / 0
  end
  if exp == 0 then return sign * math.ldexp(mant, -1074) end
  return sign * math.ldexp(mant + 2 ^ 52, exp - 1075)
end
local function double_bytes(x)
  local sign = (x < 0 or (x == 0 and 1 / x < 0)) and 128 or 0
  local a = math.abs(x)
  local exp, mant
  if x ~= x then
    exp, mant = 2047, 2 ^ 51
  elseif a == math.huge then
    exp, mant = 2047, 0
  elseif a == 0 then
    exp, mant = 0, 0
  else
    local m, e = math.frexp(a) -- a = m * 2^e, 0.5 <= m < 1
    if e - 1 >= -1022 then
      exp, mant = e + 1022, (m * 2 - 1) * 2 ^ 52
    else
      exp, mant = 0, math.ldexp(a, 1074)
    end
  end
  local out = {}
  for i = 1, 6 do
    out[i] = mant % 256
    mant = math.floor(mant / 256)
  end
  out[7] = (exp % 16) * 16 + mant
  out[8] = sign + math.floor(exp / 16)
  return string.char(unpack(out))
end
struct = {}
function struct.unpack(format, s)
  assert(string.sub(format, 1, 1) == '<', 'harness: struct formats are little-endian')
  local out, at = {}, 1
  for i = 2, #format do
    local c = string.sub(format, i, i)
    if c == 'd' then
      out[#out + 1] = double_at(s, at)
      at = at + 8
    else
      assert(c == 'H', 'harness: struct formats of H and d only')
      local lo, hi = string.byte(s, at, at + 1)
      out[#out + 1] = lo + hi * 256
      at = at + 2
    end
  end
  assert(at - 1 <= #s, 'harness: struct.unpack past the end of the string')
  out[#out + 1] = at
  return unpack(out)
end
function struct.pack(format, ...)
  assert(string.sub(format, 1, 1) == '<', 'harness: struct formats are little-endian')
  local values, out = {...}, {}
  for i = 2, #format do
    local c, v = string.sub(format, i, i), values[i - 1]
    if c == 'd' then
      out[#out + 1] = double_bytes(v)
    else
      assert(c == 'H' and v >= 0 and v < 65536 and v % 1 == 0, 'harness: struct formats of H and d only')
      out[#out + 1] = string.char(v % 256, math.floor(v / 256))
    end
  end
  return table.concat(out)
end

redis = {}
function redis.error_reply(msg) return {err = msg} end
local functions = {}
function redis.register_function(name, callback)
  if type(name) == 'table' then name, callback = name.function_name, name.callback end
  functions[name] = callback
end
if is_library then chunk() end
local zsets = {}
local function zsorted(key)
  local out = {}
  for m, sc in pairs(zsets[key] or {}) do out[#out + 1] = {sc, m} end
  table.sort(out, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
  return out
end
local function bound(s, lower)
  if s == '-inf' then return -math.huge, false end
  if s == '+inf' then return math.huge, false end
  if string.sub(s, 1, 1) == '(' then return tonumber(string.sub(s, 2)), true end
  return tonumber(s), false
end
local function in_range(sc, min, max)
  local lo, lx = bound(min)
  local hi, hx = bound(max)
  return (sc > lo or (not lx and sc == lo)) and (sc < hi or (not hx and sc == hi))
end
local function score_text(sc) return string.format('%.0f', sc) end
local function wrongtype()
  error({err = 'WRONGTYPE Operation against a key holding the wrong kind of value'})
end
local function zset_call(cmd, key, args)
  if store[key] then wrongtype() end
  local z = zsets[key]
  if cmd == 'ZCOUNT' then
    local n = 0
    for _, sc in pairs(z or {}) do if in_range(sc, args[1], args[2]) then n = n + 1 end end
    return n
  elseif cmd == 'ZSCORE' then
    return z and z[args[1]] and score_text(z[args[1]]) or false
  elseif cmd == 'ZADD' then
    zsets[key] = z or {}
    zsets[key][args[2]] = tonumber(args[1])
    return 1
  elseif cmd == 'ZREM' then
    if z then z[args[1]] = nil; if next(z) == nil then zsets[key] = nil end end
    return 1
  elseif cmd == 'ZREMRANGEBYSCORE' then
    for m, sc in pairs(z or {}) do if in_range(sc, args[1], args[2]) then z[m] = nil end end
    if z and next(z) == nil then zsets[key] = nil end
    return 1
  elseif cmd == 'ZRANGE' then -- only `key -1 -1 WITHSCORES`
    assert(args[1] == -1 and args[2] == -1 and args[3] == 'WITHSCORES', 'harness: ZRANGE form')
    local all = zsorted(key)
    local last = all[#all]
    if not last then return {} end
    return {last[2], score_text(last[1])}
  elseif cmd == 'ZRANGEBYSCORE' then -- `key min max WITHSCORES LIMIT offset count`
    assert(args[3] == 'WITHSCORES' and args[4] == 'LIMIT', 'harness: ZRANGEBYSCORE form')
    local out, skip, count = {}, tonumber(args[5]), tonumber(args[6])
    for _, e in ipairs(zsorted(key)) do
      if in_range(e[1], args[1], args[2]) then
        if skip > 0 then skip = skip - 1
        elseif #out < 2 * count then out[#out + 1] = e[2]; out[#out + 1] = score_text(e[1]) end
      end
    end
    return out
  end
  error('harness: unexpected command ' .. cmd)
end
function redis.call(cmd, key, ...)
  local args = {...}
  cmd = string.upper(cmd)
  if string.sub(cmd, 1, 1) == 'Z' then return zset_call(cmd, key, args) end
  if cmd ~= 'TIME' and cmd ~= 'DEL' and cmd ~= 'PEXPIREAT' and zsets[key] then wrongtype() end
  if cmd == 'TIME' then
    return {string.format('%.0f', math.floor(now_us / 1e6)), string.format('%.0f', now_us % 1e6)}
  elseif cmd == 'GET' then
    local v = store[key]
    if type(v) == 'table' then error({err = 'WRONGTYPE Operation against a key holding the wrong kind of value'}) end
    return v or false
  elseif cmd == 'SET' then
    -- SET key value PXAT ms, as the script sends it: replaces a value of any type.
    assert(args[2] == 'PXAT' and #args == 3, 'harness: SET takes value PXAT ms')
    store[key] = args[1]
    return {ok = 'OK'}
  elseif cmd == 'HMGET' then
    local h = store[key]
    local out = {}
    for i, f in ipairs(args) do out[i] = (h and h[f]) or false end
    return out
  elseif cmd == 'HSET' then
    store[key] = store[key] or {}
    for i = 1, #args, 2 do store[key][args[i]] = args[i + 1] end
    return 1
  elseif cmd == 'HGET' then
    return (store[key] and store[key][args[1]]) or false
  elseif cmd == 'HGETALL' then
    local out = {}
    for f, v in pairs(store[key] or {}) do out[#out + 1] = f; out[#out + 1] = v end
    return out
  elseif cmd == 'HDEL' then
    local h = store[key]
    if h then
      for _, f in ipairs(args) do h[f] = nil end
      if next(h) == nil then store[key] = nil end
    end
    return 1
  elseif cmd == 'PEXPIREAT' or cmd == 'DEL' then
    if cmd == 'DEL' then store[key] = nil; zsets[key] = nil end
    return 1
  end
  error('harness: unexpected command ' .. cmd)
end
function redis.pcall(...)
  local ok, reply = pcall(redis.call, ...)
  if ok then return reply end
  if type(reply) == 'table' then return reply end
  return {err = tostring(reply)}
end

local function json(x)
  if type(x) == 'table' then
    if x.err then return '{"error": ' .. json(x.err) .. '}' end
    local parts = {}
    for i, v in ipairs(x) do parts[i] = json(v) end
    return '[' .. table.concat(parts, ', ') .. ']'
  elseif type(x) == 'string' then
    return '"' .. string.gsub(x, '(["\\])', '\\%1') .. '"'
  end
  return string.format('%.0f', x)
end

local function flatten(x, out)
  if type(x) == 'table' then
    for _, v in ipairs(x) do flatten(v, out) end
  else
    out[#out + 1] = string.format('%.0f', x)
  end
  return out
end

for line in io.lines() do
  local words = {}
  for w in string.gmatch(line, '%S+') do words[#words + 1] = w end
  now_us = tonumber(words[1])
  KEYS = {}
  for k in string.gmatch(words[2], '[^,]+') do KEYS[#KEYS + 1] = k end
  ARGV = {}
  for i = 3, #words do
    local w = words[i]
    if string.sub(w, 1, 4) == 'hex:' then
      w = string.gsub(string.sub(w, 5), '%x%x', function(h) return string.char(tonumber(h, 16)) end)
    end
    ARGV[#ARGV + 1] = w
  end
  local ok, reply
  if is_library then
    local mode = table.remove(ARGV, 1)
    ok, reply = pcall(assert(functions['rl_' .. mode], 'no function rl_' .. mode), KEYS, ARGV)
  else
    ok, reply = pcall(chunk)
  end
  if not ok and type(reply) ~= 'table' then error(reply) end
  if type(reply) == 'string' then
    -- The script's short form and rl_acquire_packed answer four numbers packed: four
    -- doubles, 32 bytes.
    assert(#reply == 32, 'harness: a string reply is the short form\'s 32 bytes')
    local a, b, c, d = struct.unpack('<dddd', reply)
    reply = {a, b, c, d}
  end
  if as_json then
    print(json(reply))
  elseif type(reply) == 'table' and reply.err then
    print('error ' .. reply.err)
  else
    print(table.concat(flatten(reply, {}), ' '))
  end
  io.stdout:flush()
end
