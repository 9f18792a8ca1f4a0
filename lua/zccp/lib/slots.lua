-- Slot ownership across nginx workers: one lua_shared_dict key per slot, taken with
-- add() (atomic across workers). A claim never expires while its owner lives: it is
-- released by the request that holds it (release checks that it still holds it), by its
-- worker as it exits, or reaped once the worker that took it is gone (a crashed worker:
-- worker 0's timer, or the next claim that finds the pool full), never by a clock.
-- A claim that could lapse while its relay still acts hands the slot to a second
-- request that the first then damages.
local ffi = require "ffi"
local libc = require "zccp.lib.libc"
local settings = require "zccp.settings"

local ngx = ngx
local tostring = tostring
local tonumber = tonumber
local ipairs = ipairs
local str_match = string.match
local setmetatable = setmetatable

local _M = { _VERSION = "0.1.0" }

local ESRCH = 3
local seq = 0   -- this worker's claims: with its pid, a token no other claim ever had

local function dict()
    return ngx.shared[settings.get().dict]
end

-- Keys carry the engine's name and its arena's epoch: claims are per engine, and claims
-- made against a previous engine never block slots of the current one. Made once per
-- arena, epoch and slot (a request looks its slot's key up three or four times; building
-- it meant a tostring of the 64-bit epoch and four concatenations each time).
local keys_of = setmetatable({}, { __mode = "k" })   -- arena -> { epoch = e, [i] = key }
local function key(arena, i)
    local t = keys_of[arena]
    local epoch = arena.epoch
    if not t or t.epoch ~= epoch then
        t = { epoch = epoch }
        keys_of[arena] = t
    end
    local k = t[i]
    if not k then
        k = "s:" .. arena.engine .. ":" .. tostring(epoch) .. ":" .. i
        t[i] = k
    end
    return k
end

-- Each engine's claims, counted beside them ("n:<engine>"): the router's load, read with
-- one get (counting the slot keys would cost a get per slot per request).
local count_keys = {}
local function count_key(engine)
    local k = count_keys[engine]
    if not k then
        k = "n:" .. engine
        count_keys[engine] = k
    end
    return k
end

local function try_claim(d, arena, token)
    local n = arena.slot_count
    -- Rotate the starting point so workers don't all contend on slot 0.
    local start = d:incr("next", 1, 0) or 0
    for k = 0, n - 1 do
        local i = (start + k) % n
        if d:add(key(arena, i), token) then
            d:incr(count_key(arena.engine), 1, 0)
            return i
        end
    end
    return nil
end

-- Claim a free slot of `arena`: its index and the claim's token (for owns and
-- release), or nil, "busy". A full pool is first checked for claims of workers that
-- are gone (a reload's or a crash's), so none waits for the reaper's timer.
function _M.claim(arena)
    local d = dict()
    seq = seq + 1
    local token = ngx.worker.pid() .. ":" .. seq
    local i = try_claim(d, arena, token)
    if not i and _M.reap() > 0 then
        i = try_claim(d, arena, token)
    end
    if not i then
        return nil, "busy"
    end
    return i, token
end

-- Whether the claim `token` on slot i still holds.
function _M.owns(arena, i, token)
    return dict():get(key(arena, i)) == token
end

-- Give slot i back, if `token` still holds it; a claim that is not ours is left alone.
function _M.release(arena, i, token)
    local d = dict()
    local k = key(arena, i)
    if d:get(k) == token then
        d:delete(k)
        d:incr(count_key(arena.engine), -1, 0)
    end
end

-- The slots of engine `name` claimed now, by every worker.
function _M.load(name)
    return dict():get(count_key(name)) or 0
end

-- Number of slots of `arena` currently claimed by any worker.
function _M.claimed(arena)
    local d = dict()
    local n = 0
    for i = 0, arena.slot_count - 1 do
        if d:get(key(arena, i)) then
            n = n + 1
        end
    end
    return n
end

local function process_gone(pid)
    return libc.C.kill(pid, 0) ~= 0 and ffi.errno() == ESRCH
end

-- Frees every claim whose holder `done(pid)` says is done with it; how many. A claim is
-- deleted only if it still holds the value read (its worker may be writing it).
local function free_claims(done)
    local d = dict()
    local freed = 0
    for _, k in ipairs(d:get_keys(0)) do
        if str_match(k, "^s:") then
            local v = d:get(k)
            local pid = v and tonumber(str_match(v, "^(%d+):"))
            if pid and done(pid) and d:get(k) == v then
                d:delete(k)
                d:incr(count_key(str_match(k, "^s:([^:]+):")), -1, 0)
                freed = freed + 1
            end
        end
    end
    return freed
end

-- Frees every claim this worker still holds: called as the worker exits (a reload's old
-- worker, a shutdown), when a claim can only be left by a request nginx ended without it.
function _M.release_mine()
    local me = ngx.worker.pid()
    return free_claims(function(pid) return pid == me end)
end

-- Frees the claims of workers that are gone (a crash, a kill): the only way a claim
-- ends without its request. Returns how many were freed.
function _M.reap()
    return free_claims(process_gone)
end

return _M
