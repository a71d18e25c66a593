-- POST the order without an Idempotency-Key (direct, nginx, pass-through).
dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")

wrk.method = "POST"
wrk.body = body
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = authorization
