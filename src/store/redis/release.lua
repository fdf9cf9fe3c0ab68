-- KEYS: lease1, lease2, ..., then the change log: seq, changes, expiry, epoch
-- ARGV: id, channel, lease key prefix, token1, token2, ...
-- A release ends the term: the role leaves expiry and the next seq scores
-- it in changes (a seq counter lost on its own drops the epoch, as in
-- claim.lua).
local id, channel, prefix = ARGV[1], ARGV[2], ARGV[3]
local n = #KEYS - 4
local seq_key, changes_key, expiry_key, epoch_key = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3], KEYS[n + 4]
local out = {}
for i = 1, n do
  local cur = redis.call('HMGET', KEYS[i], 'holder', 'token')
  if cur[1] == id and cur[2] == ARGV[3 + i] then
    local role = string.sub(KEYS[i], #prefix + 1)
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', expiry_key, role)
    if redis.call('EXISTS', seq_key) == 0 then redis.call('DEL', epoch_key) end
    redis.call('ZADD', changes_key, redis.call('INCR', seq_key), role)
    out[#out + 1] = i
  end
end
if #out > 0 then redis.call('PUBLISH', channel, 'release') end
return out
