-- KEYS: lease1, token1, lease2, token2, ...   ARGV: id, address, channel, held1, ms1, held2, ms2, ...
local id, addr, channel = ARGV[1], ARGV[2], ARGV[3]
local out, changed = {}, false
for i = 1, #KEYS / 2 do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local held, ms = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  local cur = redis.call('HMGET', lk, 'holder', 'token')
  local holder, token = cur[1], cur[2]
  if holder == id and held ~= '' and token == held then
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = tonumber(token)
  elseif not holder or holder == id then
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
