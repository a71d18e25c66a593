-- Release a key whatever holds it, for an operator (admin DELETE): after reconciling an
-- unknown outcome, or to let a stored response be run again. The attempt count is kept, so
-- the next execution is announced upstream as attempt + 1.
--
-- KEYS[1]  record key
-- ARGV[1]  notification channel
--
-- Reply: the state that was released ("p", "c", "x", "u"), or "" when there was none

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, 1, 1) == 'r' then
  return ''
end
redis.call('SET', key, 'r0' .. string.sub(v, 3, 12) .. string.rep('0', 13) .. string.rep('\0', 48), 'KEEPTTL')
redis.call('PUBLISH', ARGV[1], key)
return string.sub(v, 1, 1)
