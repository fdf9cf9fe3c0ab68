-- KEYS: lease1, token1, lease2, token2, ...
-- ARGV: id, address, channel, held1, ms1, once1, held2, ms2, once2, ...
-- A one-shot claim (once = '1') takes only a role with no live lease key.
local id, addr, channel = ARGV[1], ARGV[2], ARGV[3]
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
    local t = redis.call('INCR', tk)
    redis.call('DEL', lk)
    redis.call('HSET', lk, 'holder', id, 'address', addr, 'token', t)
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = t
    changed = true
  end
end
if changed then redis.call('PUBLISH', channel, 'term') end
return out
