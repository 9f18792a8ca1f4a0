-- Locality in routing (docs/engines.md, "Placement"): where the engines of one model sit on
-- different NUMA nodes, a worker tries the replicas on its own node first. The nodes are
-- the placement plan's, rendered at config time: each engine's (engines[i].node) and each
-- nginx worker's (worker_nodes[worker id + 1], from its worker_cpu_affinity).
--
--   local locality = require "zccp.lib.locality"
--   locality.differ(members)          -- the members sit on more than one known node
--   locality.near_first(order, node)  -- order (engine records) made same-node first, in place
local type = type

local _M = { _VERSION = "0.1.0" }

-- Whether `members` (engine records) sit on more than one known node: only then can locality
-- change an order (one node, or placement none: the rendezvous order as it is).
function _M.differ(members)
    local seen
    for k = 1, #members do
        local node = members[k].node
        if type(node) == "number" then
            if seen and seen ~= node then
                return true
            end
            seen = node
        end
    end
    return false
end

-- This worker's node from the rendered per-worker table (worker id 0 at index 1), or nil.
function _M.worker_node(worker_nodes, id)
    if type(worker_nodes) ~= "table" or type(id) ~= "number" then
        return nil
    end
    local node = worker_nodes[id + 1]
    return type(node) == "number" and node or nil
end

-- A stable partition of `order` in place: the records on `node` first, each part keeping its
-- rendezvous order (no table made: it runs once per routed request over a few members).
function _M.near_first(order, node)
    local j = 0
    for k = 1, #order do
        local e = order[k]
        if e.node == node then
            j = j + 1
            for m = k, j + 1, -1 do
                order[m] = order[m - 1]
            end
            order[j] = e
        end
    end
    return order
end

return _M
