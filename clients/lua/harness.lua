-- Runs rl.lua, or the Functions library rl_functions.lua, outside Redis, for tests: a
-- stand-in `redis` whose TIME is the time the test gives, and whose keys live in a table. A
-- file whose first line is `#!lua` is a library: each call goes to its function `rl_<mode>`,
-- without the mode among the arguments, as FCALL sends it. Reads calls from stdin, one a line:
--
--   now_us key[,key...] mode n1 .. n10 [n1 .. n10 ...]
--
-- and prints each reply as space-separated integers (nested arrays flattened), or
-- "error <text>". Used by clients/python/tests/test_lua_vectors.py to hold the script to
-- clients/vectors/bucket.json without a server clock.
local script_path = arg[1]
local chunk = assert(loadfile(script_path)) -- skips a first line starting with '#'
local store, now_us = {}, 0
local is_library
do
  local f = assert(io.open(script_path))
  is_library = string.sub(f:read('*l') or '', 1, 5) == '#!lua'
  f:close()
end

redis = {}
function redis.error_reply(msg) return {err = msg} end
local functions = {}
function redis.register_function(name, callback)
  if type(name) == 'table' then name, callback = name.function_name, name.callback end
  functions[name] = callback
end
if is_library then chunk() end
function redis.call(cmd, key, ...)
  local args = {...}
  cmd = string.upper(cmd)
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
  elseif cmd == 'PEXPIREAT' or cmd == 'DEL' then
    if cmd == 'DEL' then store[key] = nil end
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
  for i = 3, #words do ARGV[#ARGV + 1] = words[i] end
  local reply
  if is_library then
    local mode = table.remove(ARGV, 1)
    reply = assert(functions['rl_' .. mode], 'no function rl_' .. mode)(KEYS, ARGV)
  else
    reply = chunk()
  end
  if type(reply) == 'table' and reply.err then
    print('error ' .. reply.err)
  else
    print(table.concat(flatten(reply, {}), ' '))
  end
  io.stdout:flush()
end
