-- The record layout, shared by every script that reads or writes a record: the gateway puts
-- this text before each of them. One string (see layout.rs):
--
--   state (1) | waiter flag (1) | attempt (10 digits) | lease mark (13 digits)
--   | fingerprint (32) | owner (16) | the stored response
--
-- States, one letter each (the transitions between them are drawn in docs/architecture.md):
-- "p" in progress, "c" completed (the response), "x" executed but the body was not stored
-- (status and headers), "u" outcome unknown, "r" released (a tombstone keeping the attempt
-- count; any request may claim it). The lease mark is the record's time to live
-- (PTTL) at which the lease ends: the lease is live while PTTL > mark, so times are Redis's
-- own expiry clock, never a gateway's. The flag is "1" when a duplicate waits, so that the
-- owner's settle or release publishes. A completed or executed record keeps the owner whose
-- settle wrote it. An unknown record uses the lease mark and the owner for a lookup (see
-- lookup.lua), and keeps after its header when a "not found" can be trusted, then the owner
-- whose settle made it unknown (see settle.lua).

-- Positions (1-based, inclusive, as string.sub takes them). Plain numbers, not accessor
-- functions: a script's chunk runs on every call, and each function it defines is a closure
-- made anew (measured on a renewal, 2.4 us: ten accessor functions added 0.9 us; these
-- numbers and the one function below, 0.1 us).
local STATE = 1
local WAITER = 2
local ATTEMPT_FROM, ATTEMPT_TO = 3, 12
local MARK_FROM, MARK_TO = 13, 25
local FINGERPRINT_FROM, FINGERPRINT_TO = 26, 57
local OWNER_FROM, OWNER_TO = 58, 73
local RESPONSE_FROM = 74

-- A literal, not string.rep: a constant of the chunk, made once when the script is loaded.
local NOBODY = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
local NO_FINGERPRINT = NOBODY .. NOBODY

-- A record's header (everything before the response); `waiting` is true or false. A released
-- tombstone is header('r', false, attempt, 0, NO_FINGERPRINT, NOBODY).
local function header(state, waiting, attempt, mark, fingerprint, owner)
  local flag = waiting and '1' or '0'
  return state .. flag .. string.format('%010d%013d', attempt, mark) .. fingerprint .. owner
end
