-- KEYS: the change log: seq, changes, expiry, epoch, floor
-- ARGV: lease key prefix, token key prefix, cursor epoch ('' for a full
-- read), cursor position, horizon ms, then (full read) the roles asked for.
-- seq counts the changes that began or ended a term; changes scores each
-- role by the seq of its last change; expiry scores each held role by its
-- term's end (ms, Redis's clock); epoch names this history (begun afresh,
-- from Redis's time in microseconds, when it is missing); floor is the
-- greatest seq trimmed from changes.
-- Returns a kind, the epoch, the seq, then role, holder, address, token,
-- pttl per record (as snapshot.lua). Kinds: 'full' (the roles asked for),
-- 'changes' (the roles changed after the cursor, and those whose term ends
-- within the horizon), 'gap' (no records: the cursor is of another epoch,
-- beyond seq or below floor; read again in full).
local seq_key, changes_key, expiry_key, epoch_key, floor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local lease, token = ARGV[1], ARGV[2]
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
-- Terms that ran out (their key expired) are changes, each once.
for _, role in ipairs(redis.call('ZRANGEBYSCORE', expiry_key, '-inf', int(now))) do
  if redis.call('EXISTS', lease .. role) == 0 then
    redis.call('ZREM', expiry_key, role)
    redis.call('ZADD', changes_key, redis.call('INCR', seq_key), role)
  end
end
local seq = tonumber(redis.call('GET', seq_key))
local floor = tonumber(redis.call('GET', floor_key) or '0')
local out = {'full', epoch, seq}
local function add(role)
  local lk = lease .. role
  local cur = redis.call('HMGET', lk, 'holder', 'address', 'token')
  out[#out + 1] = role
  if cur[1] then
    out[#out + 1] = cur[1]
    out[#out + 1] = cur[2] or ''
    out[#out + 1] = cur[3] or '0'
    out[#out + 1] = redis.call('PTTL', lk)
  else
    out[#out + 1] = ''
    out[#out + 1] = ''
    out[#out + 1] = redis.call('GET', token .. role) or '0'
    out[#out + 1] = 0
  end
end
if ARGV[3] == '' then
  for i = 6, #ARGV do add(ARGV[i]) end
else
  local position = tonumber(ARGV[4])
  if ARGV[3] ~= epoch or not position or position > seq or position < floor then
    out[1] = 'gap'
  else
    out[1] = 'changes'
    local seen = {}
    local changed = redis.call('ZRANGEBYSCORE', changes_key, '(' .. int(position), '+inf')
    local ending = redis.call('ZRANGEBYSCORE', expiry_key, '-inf', '(' .. int(now + tonumber(ARGV[5])))
    for _, list in ipairs({changed, ending}) do
      for _, role in ipairs(list) do
        if not seen[role] then
          seen[role] = true
          add(role)
        end
      end
    end
  end
end
-- Keep the last change of at most `keep` roles; a cursor below floor then
-- reads in full.
local extra = redis.call('ZCARD', changes_key) - keep
if extra > 0 then
  local gone = redis.call('ZRANGE', changes_key, 0, extra - 1, 'WITHSCORES')
  redis.call('SET', floor_key, gone[#gone])
  redis.call('ZREMRANGEBYRANK', changes_key, 0, extra - 1)
end
return out
