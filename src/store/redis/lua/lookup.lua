-- Lookups of an unknown record (reconciliation): at most one at a time per key, across all
-- gateways. A lookup holds the record's owner field with its own token and a lease (the lease
-- mark), as an exchange holds a claim; the record stays "u" meanwhile. Every way out of
-- "unknown" is a compare-and-set on that token, so a lookup, an operator's resolve or purge,
-- and another lookup race safely.
--
-- An unknown record keeps, after its header, when it became unknown and when a "not found"
-- answer can be trusted, both on the record's own expiry clock (PTTL), never a gateway's:
--
--   base (13 digits): the record's PTTL when it was settled as unknown
--   trust (13 digits): ms after that before "not found" is proof (the upstream may still be
--                      running the request until then); 0 when the upstream closed itself
--
-- A record written without them (by an earlier version) never trusts "not found".
--
-- KEYS[1]  record key
-- ARGV[1]  "begin" | "found" | "absent" | "failed"
--
-- begin   ARGV[2] fingerprint, ARGV[3] token, ARGV[4] lookup lease ms
--         -> {"started", attempt} | {"busy", ms left} | {"moved"}
-- found   ARGV[2] token, ARGV[3] encoded response, ARGV[4] retention ms, ARGV[5] channel
--         -> {"done"} | {"lost"}
-- absent  ARGV[2] token, ARGV[3] tombstone ttl ms, ARGV[4] channel
--         -> {"done"} | {"early", ms until trusted} | {"lost"}
-- failed  ARGV[2] token, ARGV[3] channel
--         -> {"done"} | {"lost"}
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local op = ARGV[1]
local v = redis.call('GET', key)

if op == 'begin' then
  if not v or string.sub(v, STATE, STATE) ~= 'u'
      or string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO) ~= ARGV[2] then
    return {'moved'}
  end
  local ttl = redis.call('PTTL', key)
  if string.sub(v, OWNER_FROM, OWNER_TO) ~= NOBODY then
    local left = ttl - tonumber(string.sub(v, MARK_FROM, MARK_TO))
    if left > 0 then
      -- Ask the lookup to publish when it ends, so waiters need not poll.
      if string.sub(v, WAITER, WAITER) ~= '1' then
        redis.call('SET', key, 'u1' .. string.sub(v, ATTEMPT_FROM), 'KEEPTTL')
      end
      return {'busy', left}
    end
  end
  local mark = string.format('%013d', math.max(0, ttl - tonumber(ARGV[4])))
  redis.call('SET', key, string.sub(v, 1, ATTEMPT_TO) .. mark .. string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO)
    .. ARGV[3] .. string.sub(v, RESPONSE_FROM), 'KEEPTTL')
  return {'started', tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))}
end

if not v or string.sub(v, STATE, STATE) ~= 'u' or string.sub(v, OWNER_FROM, OWNER_TO) ~= ARGV[2] then
  return {'lost'}
end
local attempt = tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))
local fingerprint = string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO)
local waiting = string.sub(v, WAITER, WAITER) == '1'

-- The record stays unknown, free for the next lookup.
local function unlock(channel)
  redis.call('SET', key, header('u', false, attempt, 0, fingerprint, NOBODY) .. string.sub(v, RESPONSE_FROM),
    'KEEPTTL')
  if waiting then
    redis.call('PUBLISH', channel, key)
  end
end

if op == 'found' then
  -- The header, then the response appended to it (see settle.lua).
  redis.call('SET', key, header('c', false, attempt, 0, fingerprint, NOBODY), 'PX', ARGV[4])
  if ARGV[3] ~= '' then
    redis.call('APPEND', key, ARGV[3])
  end
  if waiting then
    redis.call('PUBLISH', ARGV[5], key)
  end
  return {'done'}
end

if op == 'absent' then
  local tail = string.sub(v, RESPONSE_FROM)
  local ttl = redis.call('PTTL', key)
  local left = ttl
  if #tail >= 26 then
    local since = tonumber(string.sub(tail, 1, 13)) - ttl
    left = tonumber(string.sub(tail, 14, 26)) - since
  end
  if left > 0 then
    unlock(ARGV[4])
    return {'early', left}
  end
  redis.call('SET', key, header('r', false, attempt, 0, NO_FINGERPRINT, NOBODY), 'PX', ARGV[3])
  if waiting then
    redis.call('PUBLISH', ARGV[4], key)
  end
  return {'done'}
end

unlock(ARGV[3])
return {'done'}
