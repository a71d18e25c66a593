-- Mostly first requests, with one in ten a retry of an earlier request of the same thread.
dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")

local run = os.getenv("BENCH_RUN") or tostring(os.time())
local n = 0

function request()
  local k
  if n > 10 and math.random(10) == 1 then
    k = n - math.random(10)
  else
    n = n + 1
    k = n
  end
  return wrk.format("POST", nil, {
    ["content-type"] = "application/json",
    ["authorization"] = authorization,
    ["idempotency-key"] = string.format('"%s-%d-%d"', run, id, k),
  }, body)
end
