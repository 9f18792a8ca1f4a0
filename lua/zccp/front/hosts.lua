-- The front tier's hosts (docs/scale-out.md, "The front tier"): the A records of one DNS
-- name (a Kubernetes headless Service: one per ready Pod), all on one port. Worker 0
-- resolves the name every `interval_s` (zccp.front.dns, over lua-resty-dns) and publishes the sorted list in
-- the shared dict; every worker rebuilds its rendezvous ring when the list's generation
-- changes. A failed or empty resolution keeps the last good list: a DNS outage never
-- empties the tier (a host that is gone then fails its connects and is skipped, zccp.front.tier).
--
--   init({ name, port, resolver, resolver_port, interval_s, timeout_ms, dict })  -- init_by_lua
--   init_worker()                       -- init_worker_by_lua
--   local ring, addrs = current()       -- rendezvous ring over the hosts' addresses, or nil
local dns = require "zccp.front.dns"
local rendezvous = require "zccp.lib.rendezvous"

local ngx = ngx
local log = ngx.log
local ERR, WARN, NOTICE = ngx.ERR, ngx.WARN, ngx.NOTICE
local timer_at, timer_every = ngx.timer.at, ngx.timer.every
local concat = table.concat
local tsort = table.sort
local str_gmatch = string.gmatch
local tostring = tostring
local pcall = pcall

local _M = { _VERSION = "0.1.0" }

local opts          -- init()'s
local dict          -- the shared dict: "hosts" (comma-separated addresses), "gen"
local my_gen, my_ring, my_addrs   -- this worker's copy of the list
local resolving = false           -- worker 0: a resolution in flight (a slow one outlasts the interval)

function _M.init(o)
    opts = o
    dict = ngx.shared[o.dict]
    if not dict then
        error("zccp.front.hosts: no lua_shared_dict " .. tostring(o.dict))
    end
end

-- One resolution: publish the new list when it differs; keep the last good one otherwise.
local function refresh(premature)
    if premature or resolving then
        return
    end
    resolving = true
    local ok, ips, err = pcall(dns.query_a, opts.name, opts.resolver, opts.resolver_port, opts.timeout_ms)
    resolving = false
    if not ok then
        ips, err = nil, ips
    end
    if not ips or #ips == 0 then
        log(WARN, "zccp front: resolving ", opts.name, " failed (", err or "no A records",
            "): keeping the last good host list")
        dict:set("last_error", err or "no A records")
        return
    end
    tsort(ips)
    local list = concat(ips, ",")
    dict:set("last_error", nil)
    dict:set("resolved_at", ngx.now())
    if list ~= dict:get("hosts") then
        dict:set("hosts", list)
        dict:incr("gen", 1, 0)
        log(NOTICE, "zccp front: hosts of ", opts.name, ": ", list)
    end
end

function _M.init_worker()
    if ngx.worker.id() ~= 0 then
        return
    end
    local ok, err = timer_at(0, refresh)
    if ok then
        ok, err = timer_every(opts.interval_s, refresh)
    end
    if not ok then
        log(ERR, "zccp front: cannot start the resolver timer: ", err)
    end
end

-- The ring over the current hosts and their addresses (index i of one is member i of the
-- other), or nil while no resolution has succeeded yet. One dict read per call; the ring
-- is rebuilt only when the list changed.
function _M.current()
    local gen = dict:get("gen")
    if gen ~= my_gen then
        local list = dict:get("hosts")
        local addrs = {}
        if list then
            for a in str_gmatch(list, "[^,]+") do
                addrs[#addrs + 1] = a
            end
        end
        my_gen, my_addrs = gen, addrs
        my_ring = #addrs > 0 and rendezvous.new(addrs) or nil
    end
    return my_ring, my_addrs
end

-- For /health: the list, when it was last resolved, and the last resolution's error.
function _M.state()
    return dict:get("hosts"), dict:get("resolved_at"), dict:get("last_error")
end

return _M
