-- GET /health: 200 with the engine's status when it answers a ping, 503 otherwise.
local abi = require "zccp.abi"
local arena_mod = require "zccp.arena"
local slots = require "zccp.slots"
local doorbell = require "zccp.doorbell"
local settings = require "zccp.settings"
local mask_store = require "zccp.mask_store"
local cjson = require "cjson.safe"

local ngx = ngx
local tonumber = tonumber
local tostring = tostring

local _M = { _VERSION = "0.1.0" }

-- The mask set this worker applies (zccp-stack reload waits for a new worker's).
local function masks_in_force()
    return { digest = mask_store.digest(), patterns = mask_store.count(), errors = mask_store.errors() }
end

local function reply(status, t)
    t.worker_pid = ngx.worker.pid()
    t.masks = masks_in_force()
    if status ~= 200 then
        t.status = "unavailable"
    end
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Cache-Control"] = "no-store"
    ngx.print(cjson.encode(t))
end

local function ping()
    local bell, err = doorbell.open()
    if not bell then
        return nil, err
    end
    bell:set_read_timeout(settings.get().connect_timeout_ms)
    local ok, serr = bell:ping()
    if not ok then
        bell:close()
        return nil, "doorbell send: " .. serr
    end
    local n, rerr = bell:read_notice()
    if not n or n.op ~= abi.C.ZCCP_OP_PONG then
        bell:close()
        return nil, "engine did not answer the ping: " .. tostring(rerr or "unexpected frame")
    end
    local epoch = n.generation
    bell:keep()
    return epoch
end

function _M.serve()
    local a, err = arena_mod.acquire()
    if not a then
        return reply(503, { reason = err })
    end
    local epoch, perr = ping()
    if not epoch then
        a:release()
        return reply(503, { reason = perr })
    end
    if epoch ~= a.epoch then
        -- The engine answering is not the one we mapped: switch now.
        a:release()
        arena_mod.refresh()
        a, err = arena_mod.acquire()
        if not a then
            return reply(503, { reason = err })
        end
    end
    local busy = 0
    local C = abi.C
    for i = 0, a.slot_count - 1 do
        if a:header(i).state ~= C.ZCCP_STATE_FREE then
            busy = busy + 1
        end
    end
    local out = {
        status = "ok",
        engine_pid = tonumber(a.control.engine_pid),
        epoch = tostring(a.epoch):gsub("ULL$", ""),
        slots = a.slot_count,
        slots_claimed = slots.claimed(a),
        slots_busy = busy,
        payload_cap = a.payload_cap,
        response_cap = a.response_cap,
    }
    a:release()
    return reply(200, out)
end

return _M
