-- Settings rendered from config.yaml into the nginx include (init_by_lua).
-- One table per nginx instance; modules read it, nobody writes it after init.
local type = type
local error = error
local pairs = pairs

local _M = { _VERSION = "0.1.0" }

local current

local REQUIRED = {
    abi_header = "string",
    shm_name = "string",
    socket_path = "string",
    connect_timeout_ms = "number",
    request_timeout_ms = "number",
    stream_max_duration_ms = "number",   -- limits.stream_max_duration_ms (0: none)
    stream_max_bytes = "number",         -- limits.stream_max_bytes_kb, in bytes (0: none)
    max_body = "number",
    pool_size = "number",
    dict = "string",
    tenant_source = "string",   -- cache.tenant_source (zccp.lib.tenant)
}

-- l1 (optional; absent: no L1): config.yaml's cache.l1, as zccp.plugins.l1.cache reads it.
local L1 = {
    enabled = "boolean",      -- cache.enabled and cache.l1.enabled
    dict = "string",          -- the lua_shared_dict (cache.l1.size_mb)
    max_entries = "number",   -- cache.l1.max_entries
    max_entry = "number",     -- cache.l1.max_entry_kb, in bytes
    ttl_s = "number",         -- cache.l1.ttl_s
}

-- engines (optional; absent: one engine on shm_name and socket_path): config.yaml's engines:.
local ENGINE = { name = "string", model = "string", shm_name = "string", socket_path = "string" }
local POLICIES = { affinity = true, round_robin = true, least_loaded = true }

local function check_engines(t)
    local es = t.engines
    if es == nil then
        return
    end
    if type(es) ~= "table" or #es < 1 then
        error("zccp.settings.set: 'engines' must be a non-empty list", 3)
    end
    for i = 1, #es do
        for k, ty in pairs(ENGINE) do
            if type(es[i]) ~= "table" or type(es[i][k]) ~= ty then
                error("zccp.settings.set: 'engines[" .. i .. "]." .. k .. "' must be a " .. ty, 3)
            end
        end
    end
    for i = 1, #es do
        local node = es[i].node
        if node ~= nil and (type(node) ~= "number" or node < 0) then
            error("zccp.settings.set: 'engines[" .. i .. "].node' must be a NUMA node number", 3)
        end
    end
    local wn = t.worker_nodes
    if wn ~= nil and type(wn) ~= "table" then
        error("zccp.settings.set: 'worker_nodes' must be a list of NUMA node numbers", 3)
    end
    local r = t.routing
    if r ~= nil and (type(r) ~= "table" or not POLICIES[r.policy] or type(r.spill_load) ~= "number") then
        error("zccp.settings.set: 'routing' must be { policy = affinity|round_robin|least_loaded, spill_load = n }", 3)
    end
end

function _M.set(t)
    if type(t) ~= "table" then
        error("zccp.settings.set: expected a table", 2)
    end
    check_engines(t)
    for k, ty in pairs(REQUIRED) do
        if type(t[k]) ~= ty then
            error("zccp.settings.set: '" .. k .. "' must be a " .. ty, 2)
        end
    end
    local l1 = t.l1
    if l1 ~= nil then
        if type(l1) ~= "table" then
            error("zccp.settings.set: 'l1' (cache.l1) must be a table", 2)
        end
        for k, ty in pairs(L1) do
            if type(l1[k]) ~= ty then
                error("zccp.settings.set: 'l1." .. k .. "' (cache.l1." .. k .. ") must be a " .. ty, 2)
            end
        end
    end
    current = t
end

-- The configured ABI header, or nil before init (tools that only fingerprint).
function _M.abi_header()
    return current and current.abi_header
end

-- Whether API keys are on (auth.mode "keys"; zccp.plugins.auth.keys reads the same field): decides at
-- init whether the auth and limits plugins are in the chain (zccp.core.pipeline).
function _M.keys_on()
    local a = current and current.auth
    return type(a) == "table" and a.mode == "keys"
end

function _M.get()
    if not current then
        error("zccp.settings: not initialised (include zccp_http.conf)", 2)
    end
    return current
end

return _M
