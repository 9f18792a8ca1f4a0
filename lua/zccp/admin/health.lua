-- GET /health: 200 when the engine answers a ping, 503 otherwise (several engines: see
-- serve_engines). On the public listener the answer says that and nothing else ({"status":
-- "ok" | "degraded" | "unavailable"}): pids, slot counts, mask errors and the reasons (which
-- name sockets and files) are the admin listener's (zccp_admin.conf: $zccp_admin, its token).
local abi = require "zccp.lib.abi"
local arena_mod = require "zccp.lib.arena"
local slots = require "zccp.lib.slots"
local doorbell = require "zccp.lib.doorbell"
local settings = require "zccp.settings"
local mask_store = require "zccp.fp.mask_store"
local cjson = require "cjson.safe"
local engines = require "zccp.lib.engines"
local admin = require "zccp.admin.gate"
local pipeline = require "zccp.core.pipeline"

local ngx = ngx
local ngx_var = ngx.var
local tonumber = tonumber
local tostring = tostring
local ipairs = ipairs
local pairs = pairs
local io_open = io.open

local _M = { _VERSION = "0.1.0" }

-- The mask set this worker applies (zccp-stack reload waits for a new worker's).
local function masks_in_force()
    return { digest = mask_store.digest(), patterns = mask_store.count(), errors = mask_store.errors() }
end

-- Cpus_allowed_list of process pid ("self": this worker) from /proc: the placement in
-- force (docs/engines.md, "Placement"); a read of a few hundred bytes, admin only.
local function cpus_of(pid)
    local f = io_open("/proc/" .. tostring(pid) .. "/status", "r")
    if not f then
        return nil
    end
    local text = f:read("*a")
    f:close()
    return text and text:match("Cpus_allowed_list:%s*([%d,%-]+)")
end

local function reply(status, t)
    if status ~= 200 then
        t.status = "unavailable"
    end
    if ngx_var.zccp_admin ~= "1" then
        t = { status = t.status }          -- the public listener: ok or not, no details
    else
        t.worker_pid = ngx.worker.pid()
        t.worker_cpus = cpus_of("self")
        t.masks = masks_in_force()
        t.plugins = pipeline.status()   -- the chain in force, and what was refused
    end
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Cache-Control"] = "no-store"
    ngx.print(cjson.encode(t))
end

local function ping(e)
    local bell, err = doorbell.open(e)
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

-- Engine e's status: a table with status "ok" (its pid, epoch, slots; for the admin its
-- placement: the CPUs it may run on now and, with engines:, its planned NUMA node), or nil, why not.
local function engine_status(e)
    local a, err = arena_mod.acquire(e)
    if not a then
        return nil, err
    end
    local epoch, perr = ping(e)
    if not epoch then
        a:release()
        return nil, perr
    end
    if epoch ~= a.epoch then
        -- The engine answering is not the one we mapped: switch now.
        a:release()
        arena_mod.refresh(e)
        a, err = arena_mod.acquire(e)
        if not a then
            return nil, err
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
    if ngx_var.zccp_admin == "1" then   -- the details are the admin's
        out.engine_cpus = cpus_of(out.engine_pid)
        out.engine_node = e.node          -- engines:' planned node (rendered; nil: not placed, or one engine)
    end
    a:release()
    return out
end

-- Several engines (engines:): 200 while every model has an engine that answers ("ok" when
-- all do, "degraded" otherwise), 503 when a model has none; each engine's status by name,
-- and the slot counts summed (what one engine's /health says of its own).
local function serve_engines(list)
    local out = { status = "ok", engines = {}, slots = 0, slots_claimed = 0, slots_busy = 0 }
    local served = {}   -- model -> an engine of it answers
    for _, e in ipairs(list) do
        local st, err = engine_status(e)
        if st then
            st.model = e.model
            out.slots = out.slots + st.slots
            out.slots_claimed = out.slots_claimed + st.slots_claimed
            out.slots_busy = out.slots_busy + st.slots_busy
            served[e.model] = true
        else
            st = { status = "unavailable", model = e.model, reason = err }
            out.status = "degraded"
            served[e.model] = served[e.model] or false
        end
        out.engines[e.name] = st
    end
    for model, ok in pairs(served) do
        if not ok then
            out.reason = "no engine of model " .. model .. " answers"
            return reply(503, out)
        end
    end
    return reply(200, out)
end

function _M.serve()
    if ngx_var.zccp_admin == "1" and not admin.allowed("anthropic") then
        return
    end
    local list = engines.list()
    if #list > 1 then
        return serve_engines(list)
    end
    local out, err = engine_status(list[1])
    if not out then
        return reply(503, { reason = err })
    end
    return reply(200, out)
end

return _M
