-- Renew a lease, if the claim is still ours.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  lease, ms
-- ARGV[3]  ttl of an open claim, ms
--
-- Reply: 1 renewed, 0 lost (taken over, completed by another owner, purged or expired)

local key = KEYS[1]
local rec = redis.call('HMGET', key, 's', 'o')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('HSET', key, 'd', now + lease)
-- Never let the record itself expire before the lease does.
if redis.call('PTTL', key) < lease then
  redis.call('PEXPIRE', key, ARGV[3])
end
return 1
