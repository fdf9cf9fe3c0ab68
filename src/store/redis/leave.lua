-- KEYS: members zset, members hash   ARGV: id, channel
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'member')
return 1
