-- KEYS: lease1, token1, lease2, token2, ..., then the change log: seq,
-- changes, expiry, epoch
-- ARGV: id, address, channel, lease key prefix, held1, ms1, once1, held2,
-- ms2, once2, ...
-- A one-shot claim (once = '1') takes only a role with no live lease key.
-- A new term's token is max(counter + 1, server time in microseconds), stored
-- back in the counter: a restart that lost the counter (no persistence)
-- still yields tokens above all before, unless the clock went back past the
-- outage; the counter keeps two terms in one microsecond apart. Lua numbers
-- are doubles, exact to 2^53 (year 2255 in microseconds); '%.0f' writes
-- them without an exponent.
-- Every grant scores the role in expiry by its term's end (ms, Redis's
-- clock); a new term is also a change: the next seq scores it in changes.
-- A seq counter lost on its own ends the history (its epoch is dropped).
local id, addr, channel, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = (#KEYS - 4) / 2
local seq_key, changes_key = KEYS[2 * n + 1], KEYS[2 * n + 2]
local expiry_key, epoch_key = KEYS[2 * n + 3], KEYS[2 * n + 4]
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function next_seq()
  if redis.call('EXISTS', seq_key) == 0 then redis.call('DEL', epoch_key) end
  return redis.call('INCR', seq_key)
end
local out, changed = {}, false
for i = 1, n do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local role = string.sub(lk, #prefix + 1)
  local held, ms, once = ARGV[2 + 3 * i], tonumber(ARGV[3 + 3 * i]), ARGV[4 + 3 * i] == '1'
  local cur = redis.call('HMGET', lk, 'holder', 'token')
  local holder, token = cur[1], cur[2]
  if holder == id and not once and held ~= '' and token == held then
    redis.call('PEXPIRE', lk, ms)
    redis.call('ZADD', expiry_key, string.format('%.0f', now_ms + ms), role)
    out[#out + 1] = i
    out[#out + 1] = tonumber(token)
  elseif not holder or (holder == id and not once) then
    local t = math.max(tonumber(redis.call('GET', tk) or '0') + 1, now_us)
    local text = string.format('%.0f', t)
    redis.call('SET', tk, text)
    redis.call('DEL', lk)
    redis.call('HSET', lk, 'holder', id, 'address', addr, 'token', text)
    redis.call('PEXPIRE', lk, ms)
    redis.call('ZADD', expiry_key, string.format('%.0f', now_ms + ms), role)
    redis.call('ZADD', changes_key, next_seq(), role)
    out[#out + 1] = i
    out[#out + 1] = t
    changed = true
  end
end
if changed then redis.call('PUBLISH', channel, 'term') end
return out
