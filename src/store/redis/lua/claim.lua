-- Claim a key: acquire it, take it over, or report what holds it. One round trip.
--
-- KEYS[1]  record key
-- ARGV[1]  request fingerprint (raw bytes)
-- ARGV[2]  owner token of this claim (made by the gateway before the call, so that a claim
--          whose reply is lost can still be released by its owner)
-- ARGV[3]  lease, ms
-- ARGV[4]  ttl of an open claim, ms (at least the lease)
--
-- Fields: s state, f fingerprint, o owner, d lease deadline (ms, Redis server time),
-- a attempt (executions that may have reached the upstream), w someone waits, r response.
-- States: "p" in progress, "c" completed (r: the response), "x" executed but the body was not
-- stored (r: status and headers), "u" outcome unknown, "r" released (a tombstone keeping the
-- attempt count; any request may claim it).
--
-- Replies: {"acquired", attempt} | {"completed", response} | {"executed", response}
--        | {"unknown", attempt} | {"inflight", ms left} | {"mismatch"}

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])

local rec = redis.call('HMGET', key, 's', 'f', 'd', 'a', 'r')
local state = rec[1]

local function acquire(attempt)
  redis.call('HSET', key, 's', 'p', 'f', ARGV[1], 'o', ARGV[2], 'd', now + lease, 'a', attempt)
  -- A released tombstone or a lapsed claim may hold a response or a waiter flag; a new record
  -- holds neither, and a first request (the common case) skips the call.
  if state then
    redis.call('HDEL', key, 'r', 'w')
  end
  redis.call('PEXPIRE', key, ARGV[4])
  return {'acquired', attempt}
end

if not state then
  return acquire(1)
end
-- Released: nothing is stored, so any request may run, as the next attempt.
if state == 'r' then
  return acquire(tonumber(rec[4]) + 1)
end

-- The fingerprint is compared first: a different request under a used key is 422 whether the
-- first one is still running or done.
if rec[2] ~= ARGV[1] then
  return {'mismatch'}
end

if state == 'c' then
  return {'completed', rec[5]}
end
if state == 'x' then
  return {'executed', rec[5]}
end
if state == 'u' then
  return {'unknown', tonumber(rec[4])}
end

local deadline = tonumber(rec[3])
if deadline > now then
  -- Ask the owner to publish when it settles, so waiters need not poll.
  redis.call('HSET', key, 'w', 1)
  return {'inflight', deadline - now}
end

-- The lease passed without renewal: the owner died or stalled. Take over.
return acquire(tonumber(rec[4]) + 1)
