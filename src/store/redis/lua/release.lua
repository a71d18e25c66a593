-- End a claim without an outcome, if it is still ours: the next claim runs again.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  "1" if the request may have reached the upstream (the attempt is used up),
--          "0" if it certainly did not (connection refused, or never forwarded)
-- ARGV[3]  ttl of the tombstone, ms
-- ARGV[4]  notification channel
--
-- The record becomes a tombstone that keeps the attempt count, so that the next execution
-- is announced upstream as attempt + 1; an attempt that never left gives its number back.
--
-- Reply: 1 released, 0 lost

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'o', 'w', 'a')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then
  return 0
end
local attempt = tonumber(rec[4])
if ARGV[2] ~= '1' then
  attempt = attempt - 1
end
redis.call('DEL', key)
if attempt > 0 then
  redis.call('HSET', key, 's', 'r', 'a', attempt)
  redis.call('PEXPIRE', key, ARGV[3])
end
if rec[3] then
  redis.call('PUBLISH', ARGV[4], key)
end
return 1
