-- KEYS: the members: set (each id scored by its record's end, ms by
-- Redis's clock), info (id -> record), then their change log: seq,
-- changes, epoch, floor
-- ARGV: id, address, candidate (0|1), ttl ms, route-table fingerprint
-- (written after a newline when there is one), cursor epoch ('' for a full
-- read), cursor position.
-- Writes this instance's record, turns every ended record into a departure
-- and drops it, then answers. seq counts the membership changes: a join, a
-- return after the record's end, a new address, candidacy or fingerprint,
-- a leave (leave.lua), an end; a renewal that changes nothing is none.
-- changes scores each id by the seq of its last change; epoch names this
-- history (begun afresh, from Redis's time in microseconds, when it is
-- missing or its counter was lost); floor is the greatest seq trimmed from
-- changes.
-- Returns {kind, epoch, seq, members, gone}: members is id, record per
-- member, gone a list of ids. Kinds: 'full' (every live member, gone empty:
-- no cursor, or one of another epoch, beyond seq or below floor),
-- 'changes' (the live members changed after the cursor, and the ids that
-- left or ended after it).
local set_key, info_key = KEYS[1], KEYS[2]
local seq_key, changes_key, epoch_key, floor_key = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[1]
local keep = 10000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(x) return string.format('%.0f', x) end
local epoch = redis.call('GET', epoch_key)
if not epoch or redis.call('EXISTS', seq_key) == 0 then
  -- No history, or one whose counter was lost: begin another.
  epoch = int(tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', epoch_key, epoch)
  redis.call('SET', seq_key, 0, 'NX')
end
local info = ARGV[3] .. ' ' .. ARGV[2]
if ARGV[5] ~= '' then info = info .. '\n' .. ARGV[5] end
-- New, back after its end, or saying something else: a change.
local ends = redis.call('ZSCORE', set_key, id)
if not ends or tonumber(ends) <= now or redis.call('HGET', info_key, id) ~= info then
  redis.call('HSET', info_key, id, info)
  redis.call('ZADD', changes_key, redis.call('INCR', seq_key), id)
end
redis.call('ZADD', set_key, int(now + tonumber(ARGV[4])), id)
-- Records that ended are departures, each once.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', set_key, '-inf', int(now))) do
  redis.call('HDEL', info_key, gone)
  redis.call('ZADD', changes_key, redis.call('INCR', seq_key), gone)
end
redis.call('ZREMRANGEBYSCORE', set_key, '-inf', int(now))
local seq = tonumber(redis.call('GET', seq_key))
local floor = tonumber(redis.call('GET', floor_key) or '0')
local position = tonumber(ARGV[7])
local kind, members, gone = 'changes', {}, {}
local function add(m)
  members[#members + 1] = m
  members[#members + 1] = redis.call('HGET', info_key, m) or ''
end
if ARGV[6] ~= epoch or not position or position > seq or position < floor then
  kind = 'full'
  for _, m in ipairs(redis.call('ZRANGE', set_key, 0, -1)) do add(m) end
else
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', changes_key, '(' .. int(position), '+inf')) do
    if redis.call('ZSCORE', set_key, m) then add(m) else gone[#gone + 1] = m end
  end
end
-- Keep the last change of at most `keep` members; a cursor below floor
-- then reads in full.
local extra = redis.call('ZCARD', changes_key) - keep
if extra > 0 then
  local dropped = redis.call('ZRANGE', changes_key, 0, extra - 1, 'WITHSCORES')
  redis.call('SET', floor_key, dropped[#dropped])
  redis.call('ZREMRANGEBYRANK', changes_key, 0, extra - 1)
end
return {kind, epoch, seq, members, gone}
