-- Release a key whatever holds it, for an operator (admin DELETE): after reconciling an
-- unknown outcome, or to let a stored response be run again. The attempt count is kept, so
-- the next execution is announced upstream as attempt + 1.
--
-- KEYS[1]  record key
-- ARGV[1]  notification channel
--
-- Reply: the state that was released ("p", "c", "x", "u"), or "" when there was none

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'a')
if not rec[1] or rec[1] == 'r' then
  return ''
end
local ttl = redis.call('PTTL', key)
redis.call('DEL', key)
redis.call('HSET', key, 's', 'r', 'a', rec[2])
if ttl > 0 then
  redis.call('PEXPIRE', key, ttl)
end
redis.call('PUBLISH', ARGV[1], key)
return rec[1]
