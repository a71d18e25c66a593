-- Claim a key that the gateway's native claim (SET NX GET) found taken by a claim or a
-- released tombstone: acquire it, take it over, or report what holds it. One round trip.
-- (An absent key is claimed natively, and a settled one is answered from that same reply; the
-- key may have changed since, so every case is handled here again.)
--
-- KEYS[1]  record key
-- ARGV[1]  request fingerprint (32 raw bytes)
-- ARGV[2]  owner token of this claim (16 raw bytes; made by the gateway before the call, so
--          that a claim whose reply is lost can still be released by its owner)
-- ARGV[3]  lease, ms
-- ARGV[4]  ttl of an open claim, ms (at least the lease)
--
-- Replies: {"acquired", attempt} | {"completed", response} | {"executed", response}
--        | {"unknown", attempt} | {"inflight", ms left} | {"mismatch"}
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local lease = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])

local v = redis.call('GET', key)

local function acquire(attempt)
  redis.call('SET', key, header('p', false, attempt, ttl - lease, ARGV[1], ARGV[2]), 'PX', ttl)
  return {'acquired', attempt}
end

if not v then
  return acquire(1)
end
local state = string.sub(v, STATE, STATE)
local attempt = tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO))
-- Released: nothing is stored, so any request may run, as the next attempt.
if state == 'r' then
  return acquire(attempt + 1)
end

-- The fingerprint is compared first: a different request under a used key is 422 whether the
-- first one is still running or done.
if string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO) ~= ARGV[1] then
  return {'mismatch'}
end

if state == 'c' then
  return {'completed', string.sub(v, RESPONSE_FROM)}
end
if state == 'x' then
  return {'executed', string.sub(v, RESPONSE_FROM)}
end
if state == 'u' then
  return {'unknown', attempt}
end

local left = redis.call('PTTL', key) - tonumber(string.sub(v, MARK_FROM, MARK_TO))
if left > 0 then
  -- Ask the owner to publish when it settles, so waiters need not poll.
  if string.sub(v, WAITER, WAITER) ~= '1' then
    redis.call('SET', key, 'p1' .. string.sub(v, ATTEMPT_FROM), 'KEEPTTL')
  end
  return {'inflight', left}
end

-- The lease passed without renewal: the owner died or stalled. Take over.
return acquire(attempt + 1)
