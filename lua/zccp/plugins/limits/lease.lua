-- Worker-local leases of the limits' budgets (docs/keys.md, "Leases"). A windowed counter
-- in Redis (requests or tokens per minute, tokens per day or month) counts everything any
-- worker of any stack has *leased* from it; one atomic script grants a slice of what is
-- left (at least what the request needs, about 1/SHARE of the rest), never past the
-- limit. This worker spends its slices without Redis, takes refunds back into them, and
-- gives unspent budget back (the limits plugin's flush): when idle for IDLE_S, when the counter
-- is nearly spent (another worker may need it), and when the worker exits. So across all
-- workers and stacks the reservations admitted in a window never pass the limit.
--
-- Concurrency counters are counted in Redis at every admission (one more in flight if under
-- the limit), except that when the limit is far (more than SHARE slots free) a round also
-- gives the worker spare slots (1/SHARE of what is free) that its next admissions use
-- without Redis: never past the limit; another worker may be refused early by at most the
-- spare slots held elsewhere, which go back when not all needed for IDLE_S. A concurrency counter is
-- a hash, one field per worker ("<count> <time>"): each worker also writes its own count
-- as it knows it (absolute, at most every SYNC_S while it holds any, at once after a
-- Redis failover), so a count lost in Redis (a give-back a demoted master took, a round
-- that timed out) is mended within SYNC_S, and the count of a worker that died is not
-- counted STALE_S after its last write, instead of leaking for the key's TTL.
--
--   local ok, i, c = lease.acquire(target, keys, lims, wants, exact, ttls, tag)
--   lease.get(ck)                       -- this worker's budget of counter ck, or nil
--   lease.spend(ck, n) / lease.refund(ck, n)   -- refund: nil when the budget is gone
--   lease.collect(now, out, all)        -- unspent budgets to give back: out[tag][ck] -= left
--   lease.conc_free(ck) / lease.conc_take(ck, now)   -- a spare slot of this worker's
--   lease.conc_sent(ck, tag) / lease.conc_replied(ck, ok, now, granted) / lease.conc_release(ck, now)
--   lease.conc_collect(now, out, all)   -- this worker's in-flight counts to write: out[tag].conc
local sha256 = require "zccp.lib.sha256"

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
local SYNC_S = 0.5   -- a worker writes its in-flight counts at least this often while it holds any
local STALE_S = 5    -- a worker's in-flight count not written for this long is not counted
local HASH_TTL_S = 120   -- an in-flight hash nobody writes goes (every write renews it)

-- KEYS: the counters to lease from (or, exact: to count one request in flight), then this
-- round's grant record (its id: one per round). ARGV: n, share, record ttl, this worker's
-- id, STALE_S, then per counter: limit, want, exact ('1'/'0'), ttl. All pass: {1,
-- granted_1, count_1, ...}; else {0, i, count_i} and nothing is granted; {0, 0, 0}: the
-- round was undone before it ran (UNDO came first). The record (counter -> granted) lets a
-- round whose reply never came (a timeout: it may have happened) be given back by UNDO,
-- once, within its ttl. An exact counter is a hash of workers' counts ("<count> <time>",
-- Redis' clock): the fresh ones are summed, the stale ones removed.
local LEASE = [[
local n, share, uid, stale = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[4], tonumber(ARGV[5])
local rec = KEYS[n + 1]
if redis.call('EXISTS', rec) == 1 then return {0, 0, 0} end
local now = tonumber(redis.call('TIME')[1])
local cur, own = {}, {}
for i = 1, n do
  local b = 5 + (i - 1) * 4
  local c = 0
  if ARGV[b + 3] == '1' then
    local f = redis.call('HGETALL', KEYS[i])
    own[i] = 0
    for j = 1, #f, 2 do
      local v, t = string.match(f[j + 1], '^(%d+) (%d+)$')
      if v and now - tonumber(t) <= stale then
        c = c + tonumber(v)
        if f[j] == uid then own[i] = tonumber(v) end
      else
        redis.call('HDEL', KEYS[i], f[j])
      end
    end
  else
    c = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  if c + tonumber(ARGV[b + 2]) > tonumber(ARGV[b + 1]) then return {0, i, c} end
  cur[i] = c
end
local out = {1}
for i = 1, n do
  local b = 5 + (i - 1) * 4
  local lim, g = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local v
  if ARGV[b + 3] == '1' then
    local spare = math.floor((lim - cur[i] - g) / share)
    if spare > 0 then g = g + spare end
    redis.call('HSET', KEYS[i], uid, (own[i] + g) .. ' ' .. now)
    v = cur[i] + g
  else
    local slice = math.ceil((lim - cur[i]) / share)
    if slice > g then g = slice end
    v = redis.call('INCRBY', KEYS[i], g)
    redis.call('HSET', rec, KEYS[i], g)
  end
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[b + 4]))
  out[#out + 1] = g
  out[#out + 1] = v
end
redis.call('EXPIRE', rec, tonumber(ARGV[3]))
return out
]]
-- KEYS[1]: a grant record, then the windowed counters its round may have leased from
-- (declared: every key a script touches is in KEYS). Gives back what the round took (if
-- it ran) and leaves a tombstone (so a round still queued grants nothing). An in-flight
-- count the round may have taken is mended by the worker's own write (SYNC). ARGV[1]: the
-- tombstone's ttl.
local UNDO = [[
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
  for i = 2, #KEYS do
    local g = tonumber(redis.call('HGET', KEYS[1], KEYS[i]) or '0')
    if g > 0 and redis.call('EXISTS', KEYS[i]) == 1 and redis.call('DECRBY', KEYS[i], g) < 0 then
      redis.call('SET', KEYS[i], 0, 'KEEPTTL')
    end
  end
end
redis.call('SET', KEYS[1], 'x', 'EX', tonumber(ARGV[1]))
return 1
]]
-- KEYS: in-flight hashes (one tenant's). ARGV: this worker's id, the hashes' ttl, then per
-- hash: '=' (this worker's count is) or '+' (changes by), and the number. 0: the field goes.
local SYNC = [[
local uid, ttl = ARGV[1], tonumber(ARGV[2])
local now = redis.call('TIME')[1]
for i = 1, #KEYS do
  local v = tonumber(ARGV[2 + 2 * i])
  if ARGV[1 + 2 * i] == '+' then
    local cur = redis.call('HGET', KEYS[i], uid)
    v = v + (cur and tonumber(string.match(cur, '^(%d+)')) or 0)
  end
  if v > 0 then
    redis.call('HSET', KEYS[i], uid, v .. ' ' .. now)
    redis.call('EXPIRE', KEYS[i], ttl)
  else
    redis.call('HDEL', KEYS[i], uid)
  end
end
return 1
]]
local UNDO_SHA = sha256.hex(ngx.sha1_bin(UNDO), 20)
local LEASE_SHA = sha256.hex(ngx.sha1_bin(LEASE), 20)
local SYNC_SHA = sha256.hex(ngx.sha1_bin(SYNC), 20)

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
    cmd[#cmd + 1] = _M.uid()
    cmd[#cmd + 1] = STALE_S
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

-- This worker's id, unique across workers and stacks (pid, start time); a grant record's
-- id adds a sequence.
local seq, uid, uid_prefix = 0, nil, nil

function _M.uid()
    if not uid then
        uid = ngx.worker.pid() .. "." .. math_floor(ngx.now() * 1000)
        uid_prefix = uid .. "."
    end
    return uid
end

function _M.record(tag)
    if not uid then
        _M.uid()
    end
    seq = seq + 1
    return "zccp:lim:{" .. tag .. "}:g:" .. uid_prefix .. seq
end

-- The command that gives back the round of grant record `rec` (a flush sends it); keys:
-- the windowed counters of that round.
function _M.undo_cmd(rec, keys)
    local cmd = { rec, "EVALSHA", UNDO_SHA, 1 + #keys, rec }
    for i = 1, #keys do
        cmd[#cmd + 1] = keys[i]
    end
    cmd[#cmd + 1] = RECORD_TTL_S
    return cmd
end

-- This worker's requests in flight by concurrency counter ck: { held (admitted, not yet
-- ended), slots (what its field in Redis says it holds: held, plus spare slots when the
-- limit is far), spare (the last grant left room to keep spare slots), pending (rounds
-- without a reply yet), back (slots given back since the last write), tag, last (last
-- change), synced (last write), full (when all its slots were last in use), dirty (to write
-- at the next flush) }.
local inflight = {}

local function entry(ck, tag)
    local e = inflight[ck]
    if not e then
        e = { held = 0, slots = 0, spare = false, pending = 0, back = 0, tag = tag, last = 0, synced = 0,
              full = 0, dirty = false }
        inflight[ck] = e
    end
    return e
end

-- Whether this worker holds a slot of ck it does not use (an admission without Redis).
function _M.conc_free(ck)
    local e = inflight[ck]
    return e ~= nil and e.slots > e.held
end

-- One request in flight on a spare slot of this worker's (conc_free was true).
function _M.conc_take(ck, now)
    local e = inflight[ck]
    local held = e.held + 1
    e.held = held
    e.last = now
    if held == e.slots then
        e.full = now
    end
end

function _M.conc_sent(ck, tag)
    local e = entry(ck, tag)
    e.pending = e.pending + 1
end

-- A round's reply: ok true (this request is one in flight; granted: the slots the round
-- gave this worker, 1 + the spare ones), false (refused), nil (no reply: whether it ran
-- is not known; the next write says what this worker holds).
function _M.conc_replied(ck, ok, now, granted)
    local e = inflight[ck]
    e.pending = e.pending - 1
    e.last = now
    if ok then
        e.held = e.held + 1
        e.slots = e.slots + granted
        e.spare = granted > 1
        e.full = now
    elseif ok == nil then
        e.dirty = true
    end
end

-- A request ends: its slot goes back to Redis at the next flush, unless the limit is far
-- (the last grant had spare slots): then this worker keeps it for its next request, and
-- gives back its spare slots when it has not needed them all for IDLE_S.
-- Returns true when the slot goes back to Redis (the caller flushes at once: another
-- request, maybe this client's next, may be refused until it is there).
function _M.conc_release(ck, now)
    local e = inflight[ck]
    e.held = e.held - 1
    e.last = now
    if e.spare then
        return false
    end
    e.slots = e.slots - 1
    e.back = e.back - 1
    e.dirty = true
    return true
end

-- After a Redis failover (or a write that failed): every count is written again.
function _M.conc_resync()
    for _, e in pairs(inflight) do
        e.dirty = true
    end
end

-- The in-flight counts to write now, appended to out[tag].conc as ck, mode, n: this
-- worker's slots themselves ('=') when no round of its is on its way (else what changed,
-- '+'), when they changed, and every SYNC_S while it holds any or changed within STALE_S
-- (a write Redis lost is mended). Spare slots unused for IDLE_S go back. `all` (the
-- worker exits): 0 everywhere.
function _M.conc_collect(now, out, all)
    for ck, e in pairs(inflight) do
        local mode, n
        if e.slots > e.held and now - e.full >= IDLE_S then   -- spare slots not all needed for IDLE_S
            e.back = e.back - (e.slots - e.held)
            e.slots, e.spare, e.dirty = e.held, false, true
        end
        if all then
            mode, n = "=", 0
        elseif e.pending == 0 then
            if e.dirty or (now - e.synced >= SYNC_S and (e.slots > 0 or now - e.last < STALE_S)) then
                mode, n = "=", e.slots
            end
        elseif e.back ~= 0 or now - e.synced >= SYNC_S then
            mode, n = "+", e.back
        end
        if mode then
            e.back, e.dirty, e.synced = 0, false, now
            local t = out[e.tag]
            if not t then
                t = { counters = {}, usage = {} }
                out[e.tag] = t
            end
            local c = t.conc
            if not c then
                c = {}
                t.conc = c
            end
            c[#c + 1], c[#c + 2], c[#c + 3] = ck, mode, n
        elseif e.slots == 0 and e.pending == 0 and now - e.last >= STALE_S then
            inflight[ck] = nil
        end
    end
end

-- The command that writes one tenant's in-flight counts (list: ck, mode, n, ...).
function _M.sync_cmd(list)
    local keys, args = { list[1], "EVALSHA", SYNC_SHA, #list / 3 }, { _M.uid(), HASH_TTL_S }
    for i = 1, #list, 3 do
        keys[#keys + 1] = list[i]
        args[#args + 1], args[#args + 2] = list[i + 1], list[i + 2]
    end
    for i = 1, #args do
        keys[#keys + 1] = args[i]
    end
    return keys
end

_M.UNDO = UNDO
_M.SYNC, _M.SYNC_SHA = SYNC, SYNC_SHA

-- Forget every budget without giving it back (tests).
function _M.drop_all()
    budgets = {}
end


_M.SHARE = SHARE
_M.IDLE_S = IDLE_S
_M.STALE_S = STALE_S
return _M
