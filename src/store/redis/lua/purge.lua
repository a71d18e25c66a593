-- Release a key for an operator (admin DELETE): after reconciling an unknown outcome, or to
-- let a stored response be run again. The attempt count is kept, so the next execution is
-- announced upstream as attempt + 1.
--
-- A claim whose lease is live is a request running upstream now: released, a retry would run
-- it a second time beside it. It is refused unless the operator forces it. (A claim whose
-- lease has passed is no longer anyone's: the next claim would take it over all the same.)
--
-- KEYS[1]  record key
-- ARGV[1]  notification channel
-- ARGV[2]  "1" to release a claim whose lease is live (forced), else "0"
--
-- Reply: {"released", state it had ("p", "c", "x", "u")} | {"refused", ms left on the lease}
--        | {"none"} when there is nothing to release
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, STATE, STATE) == 'r' then
  return {'none'}
end
local state = string.sub(v, STATE, STATE)
if state == 'p' and ARGV[2] ~= '1' then
  local left = redis.call('PTTL', key) - tonumber(string.sub(v, MARK_FROM, MARK_TO))
  if left > 0 then
    return {'refused', left}
  end
end
local attempt = tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))
redis.call('SET', key, header('r', false, attempt, 0, NO_FINGERPRINT, NOBODY), 'KEEPTTL')
redis.call('PUBLISH', ARGV[1], key)
return {'released', state}
