-- KEYS: members set, members info, then their change log: seq, changes,
-- epoch (see presence.lua)   ARGV: id, channel
-- A leave of a listed member is a departure: the next seq scores it in
-- changes (a seq counter lost on its own drops the epoch, as in claim.lua).
local set_key, info_key = KEYS[1], KEYS[2]
local seq_key, changes_key, epoch_key = KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
redis.call('HDEL', info_key, id)
if redis.call('ZREM', set_key, id) == 1 then
  if redis.call('EXISTS', seq_key) == 0 then redis.call('DEL', epoch_key) end
  redis.call('ZADD', changes_key, redis.call('INCR', seq_key), id)
end
redis.call('PUBLISH', ARGV[2], 'member')
return 1
