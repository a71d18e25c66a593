-- Describe a record for the admin API, with times relative to Redis server time.
--
-- KEYS[1]  record key
--
-- Reply: {} when absent, else {state, attempt, lease ms left, ttl ms, response or ""}

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'a', 'd', 'r')
if not rec[1] then
  return {}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = 0
if rec[3] then
  left = math.max(0, tonumber(rec[3]) - now)
end
return {rec[1], tonumber(rec[2]), left, redis.call('PTTL', key), rec[4] or ''}
