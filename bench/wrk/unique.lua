-- A new Idempotency-Key on every request: every request is a first request.
dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")

local run = os.getenv("BENCH_RUN") or tostring(os.time())
local n = 0

function request()
  n = n + 1
  return wrk.format("POST", nil, {
    ["content-type"] = "application/json",
    ["authorization"] = authorization,
    ["idempotency-key"] = string.format('"%s-%d-%d"', run, id, n),
  }, body)
end
