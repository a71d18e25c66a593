-- One Idempotency-Key for every request: after the first, every request is a replay.
dofile(os.getenv("BENCH_WRK_DIR") .. "/common.lua")

wrk.method = "POST"
wrk.body = body
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = authorization
wrk.headers["idempotency-key"] = '"' .. (os.getenv("BENCH_RUN") or "bench") .. '-replay"'
