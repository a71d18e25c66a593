-- Release a key whatever holds it, for an operator (admin DELETE): after reconciling an
-- unknown outcome, or to let a stored response be run again. The attempt count is kept, so
-- the next execution is announced upstream as attempt + 1.
--
-- KEYS[1]  record key
-- ARGV[1]  notification channel
--
-- Reply: the state that was released ("p", "c", "x", "u"), or "" when there was none
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, STATE, STATE) == 'r' then
  return ''
end
local attempt = tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))
redis.call('SET', key, header('r', false, attempt, 0, NO_FINGERPRINT, NOBODY), 'KEEPTTL')
redis.call('PUBLISH', ARGV[1], key)
return string.sub(v, STATE, STATE)
