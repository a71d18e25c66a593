-- Describe a record for the admin API, with times relative to Redis's own clock.
--
-- KEYS[1]  record key
--
-- Reply: {} when absent, else {state, attempt, lease ms left, ttl ms, response or ""}; for an
-- unknown record, the lease left is its lookup's (0 when none runs) and there is no response.
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v then
  return {}
end
local state = string.sub(v, STATE, STATE)
local ttl = redis.call('PTTL', key)
local left = 0
if state == 'p' or (state == 'u' and string.sub(v, OWNER_FROM, OWNER_TO) ~= NOBODY) then
  left = math.max(0, ttl - tonumber(string.sub(v, MARK_FROM, MARK_TO)))
end
if state == 'u' then
  return {state, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), left, ttl, ''}
end
return {state, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), left, ttl, string.sub(v, RESPONSE_FROM)}
