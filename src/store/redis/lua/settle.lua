-- End a claim with its outcome, if the claim is still ours.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  final state: "c" completed, "x" executed (body not stored), "u" outcome unknown
-- ARGV[3]  encoded response ("c": whole; "x": status and headers; "u": empty)
-- ARGV[4]  retention, ms
-- ARGV[5]  notification channel
--
-- Reply: 1 settled, 0 lost

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'o', 'w')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', key, 's', ARGV[2], 'r', ARGV[3])
redis.call('HDEL', key, 'o', 'd', 'w')
redis.call('PEXPIRE', key, ARGV[4])
if rec[3] then
  redis.call('PUBLISH', ARGV[5], key)
end
return 1
