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
-- The record is one string (see layout.rs): state (1), waiter flag (1), attempt (10 digits),
-- lease mark (13 digits), fingerprint (32), owner (16), then the stored response.
-- States: "p" in progress, "c" completed (the response), "x" executed but the body was not
-- stored (status and headers), "u" outcome unknown, "r" released (a tombstone keeping the
-- attempt count; any request may claim it).
-- The lease mark is the record's time to live (PTTL) at which the lease ends: the lease is
-- live while PTTL > mark. Times are thus Redis's own expiry clock, never a gateway's.
--
-- Replies: {"acquired", attempt} | {"completed", response} | {"executed", response}
--        | {"unknown", attempt} | {"inflight", ms left} | {"mismatch"}

local key = KEYS[1]
local lease = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local HEADER = 73

local v = redis.call('GET', key)

local function acquire(attempt)
  redis.call('SET', key, 'p0' .. string.format('%010d%013d', attempt, ttl - lease) .. ARGV[1] .. ARGV[2], 'PX', ttl)
  return {'acquired', attempt}
end

if not v then
  return acquire(1)
end
local state = string.sub(v, 1, 1)
local attempt = tonumber(string.sub(v, 3, 12))
-- Released: nothing is stored, so any request may run, as the next attempt.
if state == 'r' then
  return acquire(attempt + 1)
end

-- The fingerprint is compared first: a different request under a used key is 422 whether the
-- first one is still running or done.
if string.sub(v, 26, 57) ~= ARGV[1] then
  return {'mismatch'}
end

if state == 'c' then
  return {'completed', string.sub(v, HEADER + 1)}
end
if state == 'x' then
  return {'executed', string.sub(v, HEADER + 1)}
end
if state == 'u' then
  return {'unknown', attempt}
end

local left = redis.call('PTTL', key) - tonumber(string.sub(v, 13, 25))
if left > 0 then
  -- Ask the owner to publish when it settles, so waiters need not poll.
  if string.sub(v, 2, 2) ~= '1' then
    redis.call('SET', key, 'p1' .. string.sub(v, 3), 'KEEPTTL')
  end
  return {'inflight', left}
end

-- The lease passed without renewal: the owner died or stalled. Take over.
return acquire(attempt + 1)
