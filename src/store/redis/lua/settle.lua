-- End a claim with its outcome, if the claim is still ours.
--
-- KEYS[1]  record key
-- KEYS[2]  (for a large response) the side key that holds it, behind room for the header
-- ARGV[1]  owner token
-- ARGV[2]  final state: "c" completed, "x" executed (body not stored), "u" outcome unknown
-- ARGV[3]  encoded response ("c": whole; "x": status and headers; in KEYS[2]: empty); for "u"
--          its times and this owner (see layout.rs)
-- ARGV[4]  retention, ms
-- ARGV[5]  notification channel
--
-- The record keeps its attempt and fingerprint (a different request is still 422); the lease
-- mark is cleared, and the owner stays, as the one that settled it (for "u", at the end of the
-- response part: the owner field is a lookup's while one runs).
--
-- The same settle may be sent again: a try whose reply was lost may have been applied. A
-- record this owner already settled with this outcome answers 1 again, so that the gateway
-- tells a try that landed from a takeover, which it must count and log; its expiry is set
-- again, so that the repeat is a write a WAIT behind it can cover.
--
-- Reply: 1 settled (now or by an earlier try), 0 lost (another owner's claim or outcome, a
-- purge, an expiry)
--
-- record.lua comes before this text: the record's positions, its header() and its states.

local key = KEYS[1]
local aside = KEYS[2]
local v = redis.call('GET', key)
if not v or string.sub(v, STATE, STATE) ~= 'p' or string.sub(v, OWNER_FROM, OWNER_TO) ~= ARGV[1] then
  if aside then
    redis.call('DEL', aside)
  end
  if v and string.sub(v, STATE, STATE) == ARGV[2] then
    local by = string.sub(v, OWNER_FROM, OWNER_TO)
    if ARGV[2] == 'u' then
      by = string.sub(v, RESPONSE_FROM + 26, RESPONSE_FROM + 41)
    end
    if by == ARGV[1] then
      -- Written again (its expiry, to the same retention) so that a repeat is a write too:
      -- a WAIT behind it on a new connection then covers the first try, which replication
      -- carried before it (see replicas.rs).
      redis.call('PEXPIRE', key, ARGV[4])
      return 1
    end
  end
  return 0
end
local settled = header(ARGV[2], false, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), 0,
  string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO), ARGV[1])
if ARGV[2] == 'u' then
  -- The owner field is for the lookups of an unknown record; its settler is in its tail.
  settled = header('u', false, tonumber(string.sub(v, ATTEMPT_FROM, ATTEMPT_TO)), 0,
    string.sub(v, FINGERPRINT_FROM, FINGERPRINT_TO), NOBODY)
end
if aside then
  -- The response is already in Redis: the header goes into the room left for it (in place),
  -- and the side key becomes the record. Neither copies the response.
  if redis.call('STRLEN', aside) <= #settled then
    return redis.error_reply('the side key of ' .. key .. ' holds no response')
  end
  redis.call('SETRANGE', aside, 0, settled)
  redis.call('RENAME', aside, key)
  redis.call('PEXPIRE', key, ARGV[4])
else
  -- The header, then the response appended to it: concatenating them in Lua would copy the
  -- response once more and leave a garbage string of its size behind.
  redis.call('SET', key, settled, 'PX', ARGV[4])
  if ARGV[3] ~= '' then
    redis.call('APPEND', key, ARGV[3])
  end
end
if string.sub(v, WAITER, WAITER) == '1' then
  redis.call('PUBLISH', ARGV[5], key)
end
return 1
