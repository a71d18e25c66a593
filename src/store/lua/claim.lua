-- Claim a key: acquire it, take it over, or report what holds it. One round trip.
--
-- KEYS[1]  record key
-- ARGV[1]  request fingerprint (raw bytes)
-- ARGV[2]  owner token of this claim
-- ARGV[3]  lease, ms
-- ARGV[4]  ttl of an open claim, ms (at least the lease)
--
-- Fields: s state ("p" in progress, "c" completed), f fingerprint, o owner, d lease deadline
-- (ms, Redis server time), a attempt, w someone waits, r stored response.
--
-- Replies: {"acquired", attempt} | {"completed", response} | {"inflight", ms left} | {"mismatch"}

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])

local rec = redis.call('HMGET', key, 's', 'f', 'd', 'a', 'r')
local state = rec[1]

if not state then
  redis.call('HSET', key, 's', 'p', 'f', ARGV[1], 'o', ARGV[2], 'd', now + lease, 'a', 1)
  redis.call('PEXPIRE', key, ARGV[4])
  return {'acquired', 1}
end

-- The fingerprint is compared first: a different request under a used key is 422 whether the
-- first one is still running or done.
if rec[2] ~= ARGV[1] then
  return {'mismatch'}
end

if state == 'c' then
  return {'completed', rec[5]}
end

local deadline = tonumber(rec[3])
if deadline > now then
  -- Ask the owner to publish when it settles, so waiters need not poll.
  redis.call('HSET', key, 'w', 1)
  return {'inflight', deadline - now}
end

-- The lease passed without renewal: the owner died or stalled. Take over.
local attempt = tonumber(rec[4]) + 1
redis.call('HSET', key, 'o', ARGV[2], 'd', now + lease, 'a', attempt)
redis.call('PEXPIRE', key, ARGV[4])
return {'acquired', attempt}
