-- Rendezvous (highest random weight) hashing: every nginx worker, on every host, ranks
-- the members for a key the same way, with no shared state; removing a member moves only
-- the keys it ranked first. Used to send a conversation to the engine replica (or host)
-- that most likely holds its prefix in KV cache.
--
--   local rendezvous = require "zccp.lib.rendezvous"
--   local ring = rendezvous.new({ "engine-a", "engine-b" })   -- once per member list
--   local order = ring:rank(key)        -- member indices, best first (a new table)
--   local i = ring:pick(key, usable)    -- the best index with usable(i) true, or nil
local bit = require "bit"

local ngx_crc32 = ngx.crc32_long
local bxor, rshift, tobit = bit.bxor, bit.rshift, bit.tobit
local setmetatable = setmetatable

local _M = { _VERSION = "0.1.0" }
local mt = { __index = _M }

-- murmur3's 32-bit finalizer: CRC-32 is linear, so two members' scores for one key
-- would differ by a fixed mask; mixing after the XOR makes each score independent.
local function fmix32(h)
    h = bxor(h, rshift(h, 16))
    h = tobit(h * 0x85ebca6b)
    h = bxor(h, rshift(h, 13))
    h = tobit(h * 0xc2b2ae35)
    local mixed = bxor(h, rshift(h, 16))
    return mixed
end

-- A ring over `names` (strings, the members' stable names: their scores derive from them).
function _M.new(names)
    local salts = {}
    for i = 1, #names do
        salts[i] = tobit(ngx_crc32(names[i]))
    end
    -- scratch: rank()'s scores, reused (a worker runs one request's Lua at a time, and rank
    -- does not yield)
    local set = setmetatable({ names = names, salts = salts, n = #names, scratch = {} }, mt)
    return set
end

-- Member i's score for a key whose CRC is hk, as an unsigned number.
local function score(self, hk, i)
    local s = fmix32(bxor(hk, self.salts[i]))
    return s < 0 and s + 4294967296 or s
end

-- All member indices for `key`, best first (ties: the lower index). An insertion sort
-- over the few members: no comparator closure and no scores table per call, as table.sort
-- would need (this runs once per routed request).
function _M.rank(self, key)
    local hk = tobit(ngx_crc32(key))
    local order, scores = {}, self.scratch
    for i = 1, self.n do
        local s = score(self, hk, i)
        local k = i - 1
        while k > 0 and scores[k] < s do   -- equal scores keep the lower index first
            order[k + 1], scores[k + 1] = order[k], scores[k]
            k = k - 1
        end
        order[k + 1], scores[k + 1] = i, s
    end
    return order
end

-- The best member for `key` among those usable(i) accepts (all, without usable), or nil.
-- No table is made: one pass keeps the best usable score.
function _M.pick(self, key, usable)
    local hk = tobit(ngx_crc32(key))
    local best, best_score = nil, -1
    for i = 1, self.n do
        if not usable or usable(i) then
            local s = score(self, hk, i)
            if s > best_score then
                best, best_score = i, s
            end
        end
    end
    return best
end

return _M
