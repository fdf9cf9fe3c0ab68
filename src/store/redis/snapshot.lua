-- KEYS: lease1, token1, ...   returns per role: holder, address, token, pttl
local out = {}
for i = 1, #KEYS / 2 do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local cur = redis.call('HMGET', lk, 'holder', 'address', 'token')
  local pttl = redis.call('PTTL', lk)
  if cur[1] then
    out[#out + 1] = cur[1]
    out[#out + 1] = cur[2] or ''
    out[#out + 1] = cur[3] or '0'
    out[#out + 1] = pttl
  else
    out[#out + 1] = ''
    out[#out + 1] = ''
    out[#out + 1] = redis.call('GET', tk) or '0'
    out[#out + 1] = 0
  end
end
return out
