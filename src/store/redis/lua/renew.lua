-- Renew a lease, if the claim is still ours.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  lease, ms
-- ARGV[3]  ttl of an open claim, ms
--
-- The new lease ends `lease` from now: at the record's PTTL minus `lease` (the lease mark,
-- see record.lua). A record that would expire before the lease gets its ttl again first.
--
-- Reply: 1 renewed, 0 lost (taken over, completed by another owner, purged or expired)
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, STATE, STATE) ~= 'p' or string.sub(v, OWNER_FROM, OWNER_TO) ~= ARGV[1] then
  return 0
end
local lease = tonumber(ARGV[2])
local left = redis.call('PTTL', key)
-- Never let the record itself expire before the lease does.
if left < lease then
  left = tonumber(ARGV[3])
  redis.call('PEXPIRE', key, left)
end
-- Only the lease mark changes.
local mark = string.format('%013d', left - lease)
redis.call('SET', key, string.sub(v, 1, ATTEMPT_TO) .. mark .. string.sub(v, FINGERPRINT_FROM), 'KEEPTTL')
return 1
