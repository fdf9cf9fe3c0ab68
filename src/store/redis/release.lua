-- KEYS: lease1, lease2, ...   ARGV: id, channel, token1, token2, ...
local id, channel = ARGV[1], ARGV[2]
local out = {}
for i = 1, #KEYS do
  local cur = redis.call('HMGET', KEYS[i], 'holder', 'token')
  if cur[1] == id and cur[2] == ARGV[2 + i] then
    redis.call('DEL', KEYS[i])
    out[#out + 1] = i
  end
end
if #out > 0 then redis.call('PUBLISH', channel, 'release') end
return out
