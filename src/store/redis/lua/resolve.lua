-- Complete an unknown or executed record with an operator's answer (admin PUT /keys). Any
-- other state is left as it is. A lookup running on the record finds it gone from "unknown"
-- and writes nothing.
--
-- KEYS[1]  record key
-- ARGV[1]  encoded response
-- ARGV[2]  retention, ms
-- ARGV[3]  notification channel
--
-- Reply: {1, state it had} resolved | {0, state it has, or ""} refused
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v then
  return {0, ''}
end
local state = string.sub(v, STATE, STATE)
if state ~= 'u' and state ~= 'x' then
  return {0, state}
end
redis.call('SET', key, header('c', false, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), 0,
  string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO), NOBODY), 'PX', ARGV[2])
if ARGV[1] ~= '' then
  redis.call('APPEND', key, ARGV[1])
end
-- Waiters on a lookup of this record re-read it.
if string.sub(v, WAITER, WAITER) == '1' then
  redis.call('PUBLISH', ARGV[3], key)
end
return {1, state}
