-- End a claim without a response, if it is still ours: the key becomes absent.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  notification channel
--
-- Reply: 1 released, 0 lost

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'o', 'w')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', key)
if rec[3] then
  redis.call('PUBLISH', ARGV[2], key)
end
return 1
