-- The index of one route's records that need an operator (see index.rs): a sorted set per
-- state, scored by expiry (ms since the Unix epoch), and a hash of descriptions. All three
-- keys share the route's hash slot.
--
-- KEYS[1]  set of unknown records
-- KEYS[2]  set of executed records
-- KEYS[3]  descriptions, by record name
-- ARGV[1]  "add" | "remove" | "list" | "count"
--
-- add     ARGV[2] "u" or "x", ARGV[3] record name, ARGV[4] expiry score, ARGV[5] description,
--         ARGV[6] now                                                      -> 1
-- remove  ARGV[2] record name                                              -> 1
-- list    ARGV[2] "u" or "x", ARGV[3] from score, ARGV[4] skip, ARGV[5] limit
--         -> {name, score, description, ...} (a description may be false)
-- count   ARGV[2] "u" or "x", ARGV[3] now                                  -> count

local op = ARGV[1]
local function set_of(letter)
  if letter == 'u' then
    return KEYS[1]
  end
  return KEYS[2]
end

if op == 'add' then
  local into = set_of(ARGV[2])
  local other = (into == KEYS[1]) and KEYS[2] or KEYS[1]
  redis.call('ZADD', into, ARGV[4], ARGV[3])
  redis.call('ZREM', other, ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[5])
  -- Expired entries go a few at a time, so that no call does unbounded work.
  for _, set in ipairs({KEYS[1], KEYS[2]}) do
    local old = redis.call('ZRANGEBYSCORE', set, '-inf', '(' .. ARGV[6], 'LIMIT', 0, 64)
    if #old > 0 then
      redis.call('ZREM', set, unpack(old))
      redis.call('HDEL', KEYS[3], unpack(old))
    end
  end
  -- The index lives as long as its last entry: a route that is removed leaves nothing behind.
  local life = tonumber(ARGV[4]) - tonumber(ARGV[6])
  for _, k in ipairs(KEYS) do
    if redis.call('PTTL', k) < life then
      redis.call('PEXPIRE', k, math.max(1, life))
    end
  end
  return 1
end

if op == 'remove' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
  return 1
end

if op == 'list' then
  local found = redis.call('ZRANGEBYSCORE', set_of(ARGV[2]), ARGV[3], '+inf', 'WITHSCORES', 'LIMIT', ARGV[4], ARGV[5])
  local out = {}
  for i = 1, #found, 2 do
    out[#out + 1] = found[i]
    out[#out + 1] = found[i + 1]
    out[#out + 1] = redis.call('HGET', KEYS[3], found[i])
  end
  return out
end

return redis.call('ZCOUNT', set_of(ARGV[2]), ARGV[3], '+inf')
