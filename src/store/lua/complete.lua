-- Store the response of a claim, if the claim is still ours.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  encoded response
-- ARGV[3]  retention, ms
-- ARGV[4]  notification channel
--
-- Reply: 1 stored, 0 lost

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'o', 'w')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', key, 's', 'c', 'r', ARGV[2])
redis.call('HDEL', key, 'o', 'd', 'w')
redis.call('PEXPIRE', key, ARGV[3])
if rec[3] then
  redis.call('PUBLISH', ARGV[4], key)
end
return 1
