-- Shared by the benchmark's wrk scripts: a ~60-byte JSON order, and a machine-readable
-- summary line that bench/run parses.

body = '{"user_id":"u-1","sku":"BOOK-42","quantity":1,"note":"bench"}'
-- The caller's credential: an idempotent route scopes its keys by it, and refuses a keyed
-- request without one (400 scope-missing).
authorization = "Bearer bench-caller"
json_headers = { ["content-type"] = "application/json", ["authorization"] = authorization }

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d status_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
