-- KEYS: partitions hash   ARGV: mode ('read' | 'define' | 'redefine'),
-- name, definition, expected epoch, settle ms, change channel.
-- A field per partition: 'epoch settled_at_ms definition', with times by
-- Redis's clock. 'read' returns name, epoch, settling ms, definition for
-- every record; 'define' records the definition unless one is recorded and
-- returns the record in force; 'redefine' replaces it only while its epoch
-- is the expected one (0: none yet), bumps the epoch, starts the settle
-- window and publishes a change, returning the new record (or nothing).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function parse(v)
  local epoch, settled, def = string.match(v, '^(%d+) (%d+) (.*)$')
  return tonumber(epoch), tonumber(settled), def
end
local function record(name, v)
  local epoch, settled, def = parse(v)
  return {name, tostring(epoch), tostring(math.max(0, settled - now)), def}
end
local mode, name = ARGV[1], ARGV[2]
if mode == 'read' then
  local out = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    for _, x in ipairs(record(all[i], all[i + 1])) do out[#out + 1] = x end
  end
  return out
end
local cur = redis.call('HGET', KEYS[1], name)
if mode == 'define' then
  if not cur then
    cur = '1 ' .. now .. ' ' .. ARGV[3]
    redis.call('HSET', KEYS[1], name, cur)
  end
  return record(name, cur)
end
local epoch = 0
if cur then epoch = parse(cur) end
if epoch ~= tonumber(ARGV[4]) then return {} end
local v = (epoch + 1) .. ' ' .. (now + tonumber(ARGV[5])) .. ' ' .. ARGV[3]
redis.call('HSET', KEYS[1], name, v)
redis.call('PUBLISH', ARGV[6], 'partition:' .. name)
return record(name, v)
