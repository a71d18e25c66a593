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
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, STATE, STATE) ~= 'p' or string.sub(v, OWNER_FROM, OWNER_TO) ~= ARGV[1] then
  return 0
end
local attempt = tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))
if ARGV[2] ~= '1' then
  attempt = attempt - 1
end
if attempt > 0 then
  redis.call('SET', key, header('r', false, attempt, 0, NO_FINGERPRINT, NOBODY), 'PX', ARGV[3])
else
  redis.call('DEL', key)
end
if string.sub(v, WAITER, WAITER) == '1' then
  redis.call('PUBLISH', ARGV[4], key)
end
return 1
