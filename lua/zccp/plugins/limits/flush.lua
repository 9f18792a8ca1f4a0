-- What this worker owes Redis (zccp.plugins.limits.admit): counters' deltas (concurrency given back,
-- overruns, unspent leases) and usage sums, sent every FLUSH_S, one script per tenant.
--
--   flush.owe(tag, ck, d)      -- a counter's delta
--   flush.dirty(w)             -- window w has usage sums to send
--   flush.line(l)              -- a usage.jsonl line
--   flush.start()              -- the timer (false: it could not start)
local sha256 = require "zccp.lib.sha256"
local usage_log = require "zccp.plugins.limits.usage_log"
local metrics = require "zccp.lib.metrics"
local lease = require "zccp.plugins.limits.lease"
local windows = require "zccp.plugins.limits.windows"

local ngx = ngx
local ngx_now = ngx.now
local ipairs = ipairs
local pairs = pairs
local setmetatable = setmetatable

local new_acc, redis_target = windows.new_acc, windows.target

local _M = { _VERSION = "0.1.0" }

local USAGE_TTL_S = 40 * 86400

-- KEYS: counters (nc), then usage hashes (nh), then the settlement's id (applied once: a
-- settlement whose reply never came is sent again, and counts once). ARGV: nc, nh, usage ttl, a delta per counter
-- (applied only while the counter's window lives; never below 0), then per hash: the
-- number of fields, then field, n pairs.
local FLUSH = [[
if not redis.call('SET', KEYS[#KEYS], 1, 'NX', 'EX', 30) then return 0 end
local nc, nh, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 1, nc do
  local d = tonumber(ARGV[3 + i])
  if d ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('INCRBY', KEYS[i], d) < 0 then redis.call('SET', KEYS[i], 0, 'KEEPTTL') end
  end
end
local a = 4 + nc
for h = 1, nh do
  local k = KEYS[nc + h]
  local nf = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, nf do
    redis.call('HINCRBY', k, ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('EXPIRE', k, ttl)
end
return 1
]]
local FLUSH_SHA = sha256.hex(ngx.sha1_bin(FLUSH), 20)
local SCRIPTS = { FLUSH, lease.UNDO, lease.SYNC }
local epoch = 0   -- the Redis target's master epoch at the last flush (zccp.lib.redis)

-- What this worker owes Redis, by tenant hash tag: counters' deltas (concurrency given
-- back, overruns, unspent leases) and usage hashes' increments; sent every FLUSH_S.
local FLUSH_S = 0.05
local RESEND_S = 25        -- a settlement without a reply is sent again for so long (ids live 30 s)
local NONE = {}
local unsent = {}          -- { cmd, at }: settlements sent during a Redis stall
local MAX_LINES = 10000
local owed, lines, flusher = {}, {}, false
local dirty = {}   -- the windows whose usage sums (w.acc) have not been sent
-- Tokens metered by API since the last flush (input, output, saved): into the Prometheus
-- counters (zccp_nginx_metered_tokens_total) at each flush; three additions per request,
-- no call (most of a request's Lua is interpreted: a call costs more than the sums).
local metered = { anthropic = { 0, 0, 0 }, openai = { 0, 0, 0 } }
local METERED = { "input", "output", "saved" }
local STATUS_FIELD = setmetatable({}, { __index = function(t, status)
    local f = "status_" .. status
    t[status] = f
    return f
end })

local function add(h, f, n)
    if n ~= 0 then
        h[f] = (h[f] or 0) + n
    end
end

local function owed_of(tag)
    local t = owed[tag]
    if not t then
        t = { counters = {}, usage = {}, undo = {} }
        owed[tag] = t
    end
    return t
end

local function owe(tag, ck, d)
    if d ~= 0 then
        local c = owed_of(tag).counters
        c[ck] = (c[ck] or 0) + d
    end
end

-- The windows' usage sums into `owed` (each into its key's and its tenant's hash), and the
-- metered tokens into their counters; the sums start again from zero.
local function fold_usage()
    local ws = dirty
    dirty = {}
    for n = 1, #ws do
        local w = ws[n]
        local acc = w.acc
        w.acc = new_acc()
        local u = owed_of(w.tenant_tag).usage
        for s = 1, 2 do
            local h = u[w.usage[s]]
            if not h then
                h = {}
                u[w.usage[s]] = h
            end
            add(h, "requests", acc.requests)
            for status, c in pairs(acc.status) do
                add(h, STATUS_FIELD[status], c)
            end
            add(h, "input_tokens", acc.input_tokens)
            add(h, "output_tokens", acc.output_tokens)
            add(h, "cache_hits", acc.cache_hits)
            add(h, "saved_tokens", acc.saved_tokens)
        end
    end
    for api, m in pairs(metered) do
        for k = 1, 3 do
            if m[k] ~= 0 then
                metrics.count("zccp_nginx_metered_tokens_total", api, METERED[k], m[k])
                m[k] = 0
            end
        end
    end
end

local function flush(premature)
    fold_usage()
    local t0 = ngx_now()
    local target = redis_target()
    if target.epoch ~= epoch then   -- a new master (Sentinel): it may have missed writes
        epoch = target.epoch
        lease.conc_resync()
    end
    lease.collect(t0, owed, premature)
    lease.conc_collect(t0, owed, premature)
    local out = lines
    lines = {}
    usage_log.write_lines(out)
    local batch = {}
    for tag, t in pairs(owed) do
        local keys, deltas, hashes = {}, {}, {}
        for ck, d in pairs(t.counters) do
            if d ~= 0 then
                keys[#keys + 1] = ck
                deltas[#deltas + 1] = d
            end
        end
        local nc = #keys
        for hk, fields in pairs(t.usage) do
            keys[#keys + 1] = hk
            local n = 0
            local args = {}
            for f, v in pairs(fields) do
                args[#args + 1] = f
                args[#args + 1] = v
                n = n + 1
            end
            hashes[#hashes + 1] = n
            for _, a in ipairs(args) do
                hashes[#hashes + 1] = a
            end
        end
        local undo = t.undo or NONE
        for u = 1, #undo, 2 do
            batch[#batch + 1] = lease.undo_cmd(undo[u], undo[u + 1])
        end
        if t.conc then
            batch[#batch + 1] = lease.sync_cmd(t.conc)
        end
        if #keys > 0 then
            local cmd = { keys[1], "EVALSHA", FLUSH_SHA, #keys + 1 }
            for _, k in ipairs(keys) do
                cmd[#cmd + 1] = k
            end
            cmd[#cmd + 1] = lease.record(tag)   -- this settlement's id
            cmd[#cmd + 1] = nc
            cmd[#cmd + 1] = #keys - nc
            cmd[#cmd + 1] = USAGE_TTL_S
            for _, d in ipairs(deltas) do
                cmd[#cmd + 1] = d
            end
            for _, a in ipairs(hashes) do
                cmd[#cmd + 1] = a
            end
            batch[#batch + 1] = cmd
        end
        owed[tag] = nil
    end
    local now = ngx_now()
    local again = unsent
    unsent = {}
    local ages = {}
    for _, u in ipairs(again) do   -- settlements a Redis stall left without a reply: each applies once
        if now - u.at < RESEND_S then
            batch[#batch + 1] = u.cmd
            ages[u.cmd] = u.at
        end
    end
    if #batch == 0 then
        return
    end
    local failed, err = target:pipeline(batch)
    if failed > 0 and err and err:find("NOSCRIPT", 1, true) then
        for _, script in ipairs(SCRIPTS) do
            target:call_key(batch[1][1], "SCRIPT", "LOAD", script)
        end
        failed, err = target:pipeline(batch)
    end
    if failed > 0 then
        ngx.log(ngx.ERR, "zccp: limits: ", failed, " tenant settlement(s) failed: ", err,
                premature and " (worker exiting)" or "; sent again")
        if not premature then
            -- which of them ran is not known: all go again (ids and tombstones: once each);
            -- the in-flight counts are written again as they are then, not as they were
            lease.conc_resync()
            for _, cmd in ipairs(batch) do
                if cmd[3] ~= lease.SYNC_SHA then
                    unsent[#unsent + 1] = { cmd = cmd, at = ages[cmd] or now }
                end
            end
        end
    end
end

local function start_flusher()
    if flusher then
        return true
    end
    local ok, err = ngx.timer.every(FLUSH_S, flush)
    if not ok then
        ngx.log(ngx.ERR, "zccp: limits flush timer: ", err)
        return false
    end
    flusher = true
    return true
end

function _M.dirty(w)
    local acc = w.acc
    if not acc.dirty then
        acc.dirty = true
        dirty[#dirty + 1] = w
    end
end

function _M.line(l)
    if #lines < MAX_LINES then
        lines[#lines + 1] = l
    else
        ngx.log(ngx.ERR, "zccp: limits: usage log queue full; one line dropped")
    end
end

-- A flush as soon as this request's log phase is over (an overrun): the next lease of any
-- worker counts it after one turn of the event loop, not FLUSH_S later.
local soon = false

local function flush_soon(premature)
    soon = false
    return flush(premature)
end

function _M.now()
    if not soon then
        soon = ngx.timer.at(0, flush_soon) and true or false
    end
end

-- A lease round whose reply never came (grant record rec, its windowed counters keys):
-- given back at the next flush.
function _M.undo(tag, rec, keys)
    local t = owed_of(tag)
    local u = t.undo or {}   -- (a table zccp.plugins.limits.lease.collect made has none)
    t.undo = u
    u[#u + 1], u[#u + 2] = rec, keys or NONE
end

_M.owe = owe
_M.start = start_flusher
_M.metered = metered
return _M
