-- Describe a record for the admin API, with times relative to Redis's own clock.
--
-- KEYS[1]  record key
--
-- Reply: {} when absent, else {state, attempt, lease ms left, ttl ms, response or ""}; for an
-- unknown record, the lease left is its lookup's (0 when none runs), and instead of a response
-- the ms until a lookup's "not found" is trusted (0: it is; -1: never, see lookup.lua).
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
  local tail = string.sub(v, RESPONSE_FROM)
  local trusted = -1
  if #tail >= 26 then
    local since = tonumber(string.sub(tail, 1, 13)) - ttl
    trusted = math.max(0, tonumber(string.sub(tail, 14, 26)) - since)
  end
  return {state, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), left, ttl, trusted}
end
return {state, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), left, ttl, string.sub(v, RESPONSE_FROM)}
