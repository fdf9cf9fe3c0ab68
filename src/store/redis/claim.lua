-- KEYS: lease1, token1, lease2, token2, ...
-- ARGV: id, address, channel, held1, ms1, once1, held2, ms2, once2, ...
-- A one-shot claim (once = '1') takes only a role with no live lease key.
-- A new term's token is max(counter + 1, server time in microseconds), stored
-- back in the counter: a restart that lost the counter (no persistence)
-- still yields tokens above all before, unless the clock went back past the
-- outage; the counter keeps two terms in one microsecond apart. Lua numbers
-- are doubles, exact to 2^53 (year 2255 in microseconds); '%.0f' writes
-- them without an exponent.
local id, addr, channel = ARGV[1], ARGV[2], ARGV[3]
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local out, changed = {}, false
for i = 1, #KEYS / 2 do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local held, ms, once = ARGV[1 + 3 * i], tonumber(ARGV[2 + 3 * i]), ARGV[3 + 3 * i] == '1'
  local cur = redis.call('HMGET', lk, 'holder', 'token')
  local holder, token = cur[1], cur[2]
  if holder == id and not once and held ~= '' and token == held then
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = tonumber(token)
  elseif not holder or (holder == id and not once) then
    local t = math.max(tonumber(redis.call('GET', tk) or '0') + 1, now_us)
    local text = string.format('%.0f', t)
    redis.call('SET', tk, text)
    redis.call('DEL', lk)
    redis.call('HSET', lk, 'holder', id, 'address', addr, 'token', text)
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = t
    changed = true
  end
end
if changed then redis.call('PUBLISH', channel, 'term') end
return out
