-- Which engine takes a request (docs/engines.md), decided before a slot is claimed: the
-- engines that serve the body's model (zccp.lib.engines), ranked for the request's route key.
--
--   affinity (routing.policy, the default): rendezvous hashing (zccp.lib.rendezvous) of the
--     route key: the fingerprint's r.route_key (a conversation's system, tools and first
--     user message, cache_control left out: the same every turn, so every turn lands on the
--     replica whose prefix cache holds the earlier ones); for a body nginx did not
--     fingerprint (Cache-Control no-cache + no-store, /v1/responses, ...):
--     fingerprint.route_key, the same key from the decoded body when it is at most 64 KiB,
--     else its first 4 KiB without "stream"/"stream_options".
--   spill: when the preferred replica has at least routing.spill_load of its slots claimed
--     (every worker's claims, zccp.lib.slots.load) and another one is less loaded, the least
--     loaded replica goes first instead (counted "spilled").
--   locality: where a model's replicas sit on different NUMA nodes (placement), the
--     replicas on the node of the worker that holds the request go first, each part in its
--     rendezvous order (zccp.lib.locality); spill and down below apply to that order as they are.
--     One node, placement none or nginx workers not placed: the rendezvous order unchanged.
--   down: an engine whose doorbell refused a connection, whose arena is gone or that failed
--     a request before answering is skipped for DOWN_S by this worker (ranked last, tried
--     only when no other is left): its requests move to the next replica in rank at once.
--   round_robin, least_loaded: for comparison (bench/routing.py).
--
--   local order, spilled = router.order(r)   -- engine records, first choice first
local engines = require "zccp.lib.engines"
local slots = require "zccp.lib.slots"
local arena_mod = require "zccp.lib.arena"
local settings = require "zccp.settings"
local locality = require "zccp.lib.locality"

local ngx = ngx
local ngx_now = ngx.now
local next = next
local type = type

local _M = { _VERSION = "0.1.0" }

local DOWN_S = 1          -- how long a failed engine is skipped before it is tried again
local fingerprint = require "zccp.fp.fingerprint"
local DEFAULT_ROUTING = { policy = "affinity", spill_load = 0.75 }
local down_until = {}     -- engine name -> time (this worker's view)
local rr = 0              -- round_robin's counter (per worker)
local my_node             -- this worker's NUMA node (false: none known), found at its first request

local cjson = require("cjson.safe").new()
cjson.decode_max_depth(64)

-- The body's model when nginx must know it (the engines serve more than one model and the
-- fingerprint did not give it: a large or no-store body); nil when any engine will do.
function _M.model_of(r, body)
    if r.fp then
        return r.fp.model
    end
    if not engines.models_differ() or not body then
        return nil
    end
    local doc = cjson.decode(body)
    return type(doc) == "table" and type(doc.model) == "string" and doc.model or nil
end

-- Whether requests must be read whole before routing (several engines: the body picks one).
function _M.needs_body()
    return engines.multi()
end

function _M.down(e)
    down_until[e.name] = ngx_now() + DOWN_S
end

-- An expired mark is dropped, so that with none down order() can see that at once (next).
local function is_down(e)
    local name = e.name
    local t = down_until[name]
    if not t then
        return false
    end
    if t > ngx_now() then
        return true
    end
    down_until[name] = nil
    return false
end

-- Engine e's load: the fraction of its slots claimed now (nil: never mapped or gone).
local function load(e)
    local n = arena_mod.slot_count(e)
    return n and slots.load(e.name) / n or nil
end

-- The route key of request r (see the top of this file).
local function key_of(r)
    if r.route_key then
        return r.route_key
    end
    local fp = r.fp
    if fp and fp.route_key then
        return fp.route_key
    end
    local body = r.src and r.src.body
    if not body then
        return ""
    end
    r.route_key = fingerprint.route_key(r.api, body, r.endpoint)   -- once per request
    return r.route_key
end

local function worker_node()
    if my_node == nil then
        my_node = locality.worker_node(settings.get().worker_nodes, ngx.worker.id()) or false
    end
    return my_node
end

local function rank(g, r, policy)
    local members, n = g.members, #g.members
    if policy == "affinity" then
        local order = g.ring:rank(key_of(r))   -- a new table of indices: made the members in place
        for k = 1, n do
            order[k] = members[order[k]]
        end
        if g.nodes_differ then
            local node = worker_node()
            if node then
                locality.near_first(order, node)
            end
        end
        return order
    end
    local order = {}
    if policy == "round_robin" then
        rr = rr + 1
        for k = 1, n do
            order[k] = members[(rr + k) % n + 1]
        end
    else   -- least_loaded: ranked by load below
        for k = 1, n do
            order[k] = members[k]
        end
    end
    return order
end

-- The engines to try for request r, best first, and whether the first was chosen for load
-- (spilled) or because the preferred one is down (failed over).
function _M.order(r)
    local g = engines.group(r.model) or engines.everyone()
    local n = #g.members
    if n == 1 then
        return g.members, false, false
    end
    local routing = settings.get().routing or DEFAULT_ROUTING
    local policy = routing.policy
    local order = rank(g, r, policy)
    -- down engines to the back, in rank order (none marked: the order as ranked, no copies)
    local up, back = order, nil
    if next(down_until) ~= nil then
        up, back = {}, {}
        for k = 1, n do
            local e = order[k]
            if is_down(e) then
                back[#back + 1] = e
            else
                up[#up + 1] = e
            end
        end
    end
    local failed_over = up[1] ~= order[1]
    local spilled = false
    if up[1] and (policy ~= "round_robin") then
        local best, best_load = 1, load(up[1])
        local bound = routing.spill_load
        if policy == "least_loaded" or (best_load and best_load >= bound) then
            for k = 2, #up do
                local l = load(up[k])
                if l and (not best_load or l < best_load) then
                    best, best_load = k, l
                end
            end
            if best ~= 1 then
                local chosen = up[best]
                for k = best, 2, -1 do
                    up[k] = up[k - 1]
                end
                up[1] = chosen
                spilled = policy ~= "least_loaded"
            end
        end
    end
    if back then
        for k = 1, #back do
            up[#up + 1] = back[k]
        end
    end
    return up, spilled, failed_over
end

return _M
