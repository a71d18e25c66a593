-- End a claim with its outcome, if the claim is still ours.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  final state: "c" completed, "x" executed (body not stored), "u" outcome unknown
-- ARGV[3]  encoded response ("c": whole; "x": status and headers; "u": empty)
-- ARGV[4]  retention, ms
-- ARGV[5]  notification channel
--
-- The record keeps its attempt and fingerprint (a different request is still 422); the lease
-- mark and the owner are cleared.
--
-- Reply: 1 settled, 0 lost

local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, 1, 1) ~= 'p' or string.sub(v, 58, 73) ~= ARGV[1] then
  return 0
end
-- The header, then the response appended to it: concatenating them in Lua would copy the
-- response once more and leave a garbage string of its size behind.
redis.call('SET', key,
  ARGV[2] .. '0' .. string.sub(v, 3, 12) .. string.rep('0', 13) .. string.sub(v, 26, 57) .. string.rep('\0', 16),
  'PX', ARGV[4])
if ARGV[3] ~= '' then
  redis.call('APPEND', key, ARGV[3])
end
if string.sub(v, 2, 2) == '1' then
  redis.call('PUBLISH', ARGV[5], key)
end
return 1
