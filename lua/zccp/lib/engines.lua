-- The engines behind this nginx (config.yaml's engines:, docs/engines.md): each one's name,
-- model, arena (shm_name) and doorbell (socket_path), and the groups of replicas that serve
-- one model. Without engines: one engine, "default", serving whatever the request names
-- (it answers an unknown model's 404 itself), on settings' shm_name and socket_path.
--
--   local engines = require "zccp.lib.engines"
--   engines.list()             -- every engine record { name, model, shm_name, socket_path, index, node }
--   engines.group(model)       -- { members = { engine, ... }, ring = rendezvous, nodes_differ } serving
--                                 model, or nil (nodes_differ: its replicas sit on several NUMA nodes)
--   engines.everyone()         -- the group of all engines (models list, purge, an unknown model)
--   engines.multi()            -- more than one engine
--   engines.models_differ()    -- the engines serve more than one model (the body's model picks)
local settings = require "zccp.settings"
local rendezvous = require "zccp.lib.rendezvous"
local locality = require "zccp.lib.locality"

local ipairs = ipairs
local pairs = pairs

local _M = { _VERSION = "0.1.0" }

local list, groups, everyone, multi, models_differ

local function build()
    local s = settings.get()
    list, groups = {}, {}
    local rows = s.engines or { { name = "default", shm_name = s.shm_name, socket_path = s.socket_path } }
    local names = {}
    for i, row in ipairs(rows) do
        local e = { name = row.name, model = row.model, shm_name = row.shm_name, socket_path = row.socket_path,
                    index = i, node = row.node }   -- node: its planned NUMA node (nil: not placed)
        list[i] = e
        names[i] = e.name
        if e.model then
            local g = groups[e.model]
            if not g then
                g = { members = {}, names = {} }
                groups[e.model] = g
            end
            g.members[#g.members + 1] = e
            g.names[#g.names + 1] = e.name
        end
    end
    everyone = { members = list, ring = rendezvous.new(names), nodes_differ = locality.differ(list) }
    local nmodels = 0
    for _, g in pairs(groups) do
        g.ring = rendezvous.new(g.names)
        g.nodes_differ = locality.differ(g.members)
        nmodels = nmodels + 1
    end
    multi = #list > 1
    models_differ = nmodels > 1
end

function _M.list()
    if not list then
        build()
    end
    return list
end

function _M.group(model)
    if not list then
        build()
    end
    return model and groups[model] or nil
end

function _M.everyone()
    if not list then
        build()
    end
    return everyone
end

function _M.multi()
    if not list then
        build()
    end
    return multi
end

function _M.models_differ()
    if not list then
        build()
    end
    return models_differ
end

-- The engine record named `name`, or nil.
function _M.named(name)
    for _, e in ipairs(_M.list()) do
        if e.name == name then
            return e
        end
    end
end

return _M
