-- Worker-local leases of the limits' budgets (docs/keys.md, "Leases"). A windowed counter
-- in Redis (requests or tokens per minute, tokens per day or month) counts everything any
-- worker of any stack has *leased* from it; one atomic script grants a slice of what is
-- left (at least what the request needs, about 1/SHARE of the rest), never past the
-- limit. This worker spends its slices without Redis, takes refunds back into them, and
-- gives unspent budget back (zccp.limits' flush): when idle for IDLE_S, when the counter
-- is nearly spent (another worker may need it), and when the worker exits. So across all
-- workers and stacks the reservations admitted in a window never pass the limit.
--
-- Concurrency counters are not leased: every admission with a concurrency limit asks Redis
-- (INCR if under the limit), so that limit is exact.
--
--   local ok, i, c = lease.acquire(target, keys, lims, wants, exact, ttls, tag)
--   lease.get(ck)                       -- this worker's budget of counter ck, or nil
--   lease.spend(ck, n) / lease.refund(ck, n)   -- refund: nil when the budget is gone
--   lease.collect(now, out, all)        -- unspent budgets to give back: out[tag][ck] -= left
local sha256 = require "zccp.sha256"

local ngx = ngx
local type = type
local tonumber = tonumber
local pairs = pairs
local unpack = unpack
local math_ceil = math.ceil
local math_floor = math.floor

local _M = { _VERSION = "0.1.0" }

local SHARE = 16     -- a lease takes about 1/SHARE of what is left in the window
local RECORD_TTL_S = 30   -- a round's grant record: UNDO must reach Redis within this
local IDLE_S = 1     -- an unused budget goes back to Redis after this

-- KEYS: the counters to lease from (or, exact: to count one request in flight), then this
-- round's grant record (its id: one per round). ARGV: n, share, record ttl, then per
-- counter: limit, want, exact ('1'/'0'), ttl. All pass: {1, granted_1, count_1, ...};
-- else {0, i, count_i} and nothing is granted; {0, 0, 0}: the round was undone before it
-- ran (UNDO came first). The record (counter -> granted) lets a round whose reply never
-- came (a timeout: it may have happened) be given back by UNDO, once, within its ttl.
local LEASE = [[
local n, share = tonumber(ARGV[1]), tonumber(ARGV[2])
local rec = KEYS[n + 1]
if redis.call('EXISTS', rec) == 1 then return {0, 0, 0} end
local cur = {}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local c = tonumber(redis.call('GET', KEYS[i]) or '0')
  if c + tonumber(ARGV[b + 2]) > tonumber(ARGV[b + 1]) then return {0, i, c} end
  cur[i] = c
end
local out = {1}
for i = 1, n do
  local b = 3 + (i - 1) * 4
  local lim, g = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  if ARGV[b + 3] ~= '1' then
    local slice = math.ceil((lim - cur[i]) / share)
    if slice > g then g = slice end
  end
  local v = redis.call('INCRBY', KEYS[i], g)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[b + 4]))
  out[#out + 1] = g
  out[#out + 1] = v
  redis.call('HSET', rec, KEYS[i], g)
end
redis.call('EXPIRE', rec, tonumber(ARGV[3]))
return out
]]
-- KEYS[1]: a grant record. Gives back what its round took (if it ran) and leaves a
-- tombstone (so a round still queued grants nothing). ARGV[1]: the tombstone's ttl.
local UNDO = [[
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
  local f = redis.call('HGETALL', KEYS[1])
  for i = 1, #f, 2 do
    if redis.call('EXISTS', f[i]) == 1 and redis.call('DECRBY', f[i], f[i + 1]) < 0 then
      redis.call('SET', f[i], 0, 'KEEPTTL')
    end
  end
end
redis.call('SET', KEYS[1], 'x', 'EX', tonumber(ARGV[1]))
return 1
]]
local UNDO_SHA = sha256.hex(ngx.sha1_bin(UNDO), 20)
local LEASE_SHA = sha256.hex(ngx.sha1_bin(LEASE), 20)

-- ck -> { left, seen (the counter in Redis after our last lease), lim, used (last spend),
-- ends (the window's end), tag (the tenant's hash tag) }
local budgets = {}

function _M.get(ck)
    return budgets[ck]
end

function _M.spend(ck, n, now)
    local b = budgets[ck]
    b.left = b.left - n
    b.used = now
end

-- A request's reservation that was not used comes back to this worker's budget (n > 0),
-- or an overrun is charged to it (n < 0). Returns what could not be applied here (the
-- budget is gone, or went below zero): the caller sends it to Redis.
function _M.refund(ck, n)
    local b = budgets[ck]
    if not b then
        return n
    end
    local left = b.left + n
    if left < 0 then
        b.left = 0
        return left
    end
    b.left = left
    return 0
end

-- One round trip: lease `wants[i]` (at least) of each counter keys[i], or count one in
-- flight (exact[i]). Returns true, or false, i, count (counter i has not enough left), or
-- nil, err. ends[i]: when counter i's window ends (its budget is dropped then).
function _M.acquire(target, keys, lims, wants, exact, ttls, ends, tag, now, rec)
    local n = #keys
    local cmd = { "EVALSHA", LEASE_SHA, n + 1 }
    for i = 1, n do
        cmd[#cmd + 1] = keys[i]
    end
    cmd[#cmd + 1] = rec
    cmd[#cmd + 1] = n
    cmd[#cmd + 1] = SHARE
    cmd[#cmd + 1] = RECORD_TTL_S
    for i = 1, n do
        cmd[#cmd + 1] = lims[i]
        cmd[#cmd + 1] = wants[i]
        cmd[#cmd + 1] = exact[i] and "1" or "0"
        cmd[#cmd + 1] = ttls[i]
    end
    local res, err = target:call_key(keys[1], unpack(cmd))
    if err and err:find("NOSCRIPT", 1, true) then
        cmd[1], cmd[2] = "EVAL", LEASE
        res, err = target:call_key(keys[1], unpack(cmd))
    end
    if not res then
        return nil, err
    end
    if type(res) ~= "table" then
        return nil, "bad lease reply"
    end
    if res[1] == 0 then
        if tonumber(res[2]) == 0 then
            return nil, "lease round undone"
        end
        return false, tonumber(res[2]), tonumber(res[3]) or 0
    end
    for i = 1, n do
        if not exact[i] then
            local g, v = tonumber(res[2 * i]) or 0, tonumber(res[2 * i + 1]) or 0
            local b = budgets[keys[i]]
            if b then
                b.left, b.seen, b.used = b.left + g, v, now
            else
                budgets[keys[i]] = { left = g, seen = v, lim = lims[i], used = now, ends = ends[i], tag = tag }
            end
        end
    end
    return true, res
end

-- The unspent budgets to give back now, added to out[tag][ck] (negative deltas): every
-- one when `all` (the worker exits); else those idle for IDLE_S, and those of a counter
-- nearly spent in Redis (less than a slice left for the other workers). A window that has
-- ended is dropped (its counter expires in Redis).
function _M.collect(now, out, all)
    for ck, b in pairs(budgets) do
        if b.ends <= now then
            budgets[ck] = nil
        elseif all or now - b.used >= IDLE_S or b.lim - b.seen < math_ceil(b.lim / SHARE) then
            budgets[ck] = nil
            if b.left > 0 then
                local t = out[b.tag]
                if not t then
                    t = { counters = {}, usage = {} }
                    out[b.tag] = t
                end
                t.counters[ck] = (t.counters[ck] or 0) - b.left
            end
        end
    end
end

-- A grant record's id, unique across workers and stacks (pid, start time, a sequence).
local seq, uid_prefix = 0, nil

function _M.record(tag)
    if not uid_prefix then
        uid_prefix = ngx.worker.pid() .. "." .. math_floor(ngx.now() * 1000) .. "."
    end
    seq = seq + 1
    return "zccp:lim:{" .. tag .. "}:g:" .. uid_prefix .. seq
end

-- The command that gives back the round of grant record `rec` (a flush sends it).
function _M.undo_cmd(rec)
    return { rec, "EVALSHA", UNDO_SHA, 1, rec, RECORD_TTL_S }
end

_M.UNDO = UNDO

-- Forget every budget without giving it back (tests).
function _M.drop_all()
    budgets = {}
end

_M.SHARE = SHARE
_M.IDLE_S = IDLE_S
return _M
