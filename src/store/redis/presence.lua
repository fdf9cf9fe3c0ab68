-- KEYS: members zset, members hash   ARGV: id, address, candidate (0|1), ttl ms,
-- route-table fingerprint (written after a newline when there is one)
-- Scores are expiry times by Redis's clock. Writes this instance's record,
-- drops expired ones, returns id, address, candidate for each live one.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[1])
local info = ARGV[3] .. ' ' .. ARGV[2]
if ARGV[5] ~= '' then info = info .. '\n' .. ARGV[5] end
redis.call('HSET', KEYS[2], ARGV[1], info)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(gone) do redis.call('HDEL', KEYS[2], id) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
