-- Slot ownership across nginx workers: one lua_shared_dict key per slot, taken
-- with add() (atomic across workers) and a TTL a little above the request
-- timeout, so a crashed worker's slots come back by themselves.
local ngx = ngx
local settings = require "zccp.settings"

local tostring = tostring

local _M = { _VERSION = "0.1.0" }

local TTL_SLACK_S = 5

local function dict()
    return ngx.shared[settings.get().dict]
end

-- Keys carry the arena epoch: claims made against a previous engine never
-- block slots of the current one.
local function key(arena, i)
    return "s:" .. tostring(arena.epoch) .. ":" .. i
end

-- Claim a free slot of `arena`; returns its index or nil, "busy".
function _M.claim(arena)
    local d = dict()
    local n = arena.slot_count
    local ttl = settings.get().request_timeout_ms / 1000 + TTL_SLACK_S
    -- Rotate the starting point so workers don't all contend on slot 0.
    local start = d:incr("next", 1, 0) or 0
    local pid = ngx.worker.pid()
    for k = 0, n - 1 do
        local i = (start + k) % n
        local ok = d:add(key(arena, i), pid, ttl)
        if ok then
            return i
        end
    end
    return nil, "busy"
end

function _M.release(arena, i)
    dict():delete(key(arena, i))
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

return _M
