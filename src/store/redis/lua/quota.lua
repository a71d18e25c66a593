-- Count one new key against a budget per window. One round trip.
--
-- KEYS[1]  quota counter key
-- ARGV[1]  window, ms
--
-- The window starts with the first key counted and ends when the counter expires (Redis
-- time, never a gateway's clock), so every gateway sharing this Redis shares one budget.
--
-- Reply: {count in this window, ms until the window ends}

local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {n, redis.call('PTTL', KEYS[1])}
