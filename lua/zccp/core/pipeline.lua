-- The plugin chain: config.yaml's plugins.chain, built once at init into one runner per
-- phase (a phase no plugin implements is an empty runner). A plugin whose _active(conf)
-- says false (its feature is off in this config) is listed but in no phase: a request pays
-- nothing for it. Loading and checking each plugin: zccp.core.plugin_load.
-- A plugin ends a request with refuse() (or answers it itself and returns DONE); a plugin
-- that raises is that request's 500 and zccp_nginx_plugin_errors_total{plugin}; the phases
-- that settle (relayed, response, log) run every plugin whatever another one did.
local metrics = require "zccp.lib.metrics"
local errors = require "zccp.errors"
local loader = require "zccp.core.plugin_load"
local phase_runner = require "zccp.core.phase_runner"

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local pcall = pcall
local type = type
local pairs = pairs
local ipairs = ipairs
local tostring = tostring
local concat = table.concat
local setmetatable = setmetatable

local _M = { _VERSION = "0.2.0" }

-- What a plugin returns when it answered the request: the chain stops there.
local DONE = "zccp.done"
_M.DONE = DONE

-- The phases, in request order (docs/plugins.md). wants_body is asked before the body
-- is read: true from any plugin reads it whole instead of streaming it into the slot
-- (DONE: one raised, the request is answered). response runs in nginx's header filter, for every answer (L1 hits, refusals, errors).
_M.PHASES = { "access", "wants_body", "prepare", "keys", "route", "filled", "headers", "relayed",
              "response", "log" }
local IS_PHASE = {}
for _, p in ipairs(_M.PHASES) do
    IS_PHASE[p] = true
end
-- Phases that run every plugin: a raise is counted and logged, the next plugin still runs
-- (the built-ins that settle, meter and release are among them).
local EVERY = { relayed = true, response = true, log = true }
-- Phases whose plugins do a request's real work (the key check, the admission, the cache's
-- lookup, the settlement): their runners are one segment under one pcall that ends the
-- traces through the plugins before it (zccp.core.phase_runner); the others, one pcall per
-- plugin.
local STOPS = { access = true, prepare = true, keys = true, log = true }

local chains = {}        -- phase -> { n, fns, confs, names }
local loaded = {}        -- the chain in force: { { name, file, phases } }
local load_errors = {}   -- { { plugin, file, message } }: refused at the last (re)load

-- What the core takes from plugins without naming one (the router's order of engines, the
-- key's models): name -> function, from each active plugin's _provides; nil: the core's own.
-- One table for the VM's life (modules keep it): init refills it.
local hooks = {}
_M.hooks = hooks

-- The one call that ends a request from a plugin: an API-shaped error in the request's
-- API (status, kind as in zccp.error_kinds, message naming the field). Returns DONE.
function _M.refuse(r, status, kind, message, headers)
    errors.send(r.api, status, kind, message, headers)
    return DONE
end

-- The request's 500 for a plugin that raised; other requests never see it.
local function failed(r, name, err)
    metrics.plugin_error(name)
    ngx_log(ngx_ERR, "zccp: plugin ", name, " failed: ", tostring(err))
    if r and r.api and not ngx.headers_sent then
        errors.send(r.api, 500, "api_error", "internal error in the gateway (plugin " .. name .. ")")
    end
    r.failed = name
    return DONE
end

-- A raise in a phase that runs every plugin: counted and logged; the request is marked.
local function counted(r, name, err)
    metrics.plugin_error(name)
    ngx_log(ngx_ERR, "zccp: plugin ", name, " failed: ", tostring(err))
    r.failed = name
end

-- Each phase's runner, made once per chain (zccp.core.phase_runner): a raise named by its
-- plugin and, in the phases that run every plugin, the rest run after it; a shape LuaJIT
-- compiles through.
local runners = {}

local function compile(phase, c)
    local kind = phase == "wants_body" and "any" or EVERY[phase] and "every" or "run"
    runners[phase] = phase_runner.build(kind, phase, c, kind == "every" and counted or failed, DONE, STOPS[phase])
end

-- Runs phase `phase` for request r: DONE once a plugin answered (or raised), else nil.
-- a1..a3: the phase's own arguments (fixed: no varargs on the hot path).
function _M.run(phase, r, a1, a2, a3)
    return runners[phase](r, a1, a2, a3)
end

-- Whether any plugin asks for the whole body before it is read (phase wants_body).
function _M.any(phase, r)
    return runners[phase](r)
end

-- log_by_lua of the API locations: the request's r (zccp.handler keeps it in ngx.ctx.zccp),
-- or a bare one for a request answered before it had one. r.log_api: the API whose
-- request metrics count it (nil: the models location, counted by its limits only).
function _M.log(api)
    local r = ngx.ctx.zccp
    if not r then
        r = { api = api }
    end
    r.log_api = api
    return runners.log(r)
end

-- header_filter_by_lua of the API locations: the response phase, for every answer. A
-- raise there cannot turn the answer into an error any more (its status is on its way):
-- the connection is closed instead, so no answer goes out after a plugin failed.
function _M.response()
    if chains.response.n == 0 then
        return
    end
    local r = ngx.ctx.zccp
    if not r then
        return
    end
    local prior = r.failed   -- a plugin that failed earlier: its 500 is this answer
    r.failed = nil
    runners.response(r)
    if r.failed then
        return ngx.exit(ngx.ERROR)
    end
    r.failed = prior
end

-- A plugin that cannot be loaded under a bare nginx HUP (no last good copy): in the chain
-- as a plugin that refuses its requests (503 naming it), never skipped.
local function unloaded(name)
    local msg = "plugin " .. name .. " is not loaded; the gateway refuses requests until it loads"
    return { name = name, access = function(r)
        errors.send(r.api, 503, "api_error", msg)
        return DONE
    end }
end

-- Whether this init is a reload of a running nginx (a HUP): nginx keeps its shared dicts
-- across a HUP; a start or `nginx -t` begins with them empty.
local STARTED = "zccp:plugins:started"
local function reloading()
    local d = ngx.shared and ngx.shared.zccp_metrics
    return d and d:get(STARTED) or false, d
end

local function is_builtin(name)
    return package.searchpath("zccp.plugins." .. name, package.path) ~= nil
end

-- opts (settings.plugins, rendered from engine/zccp/config/plugins.py, the one source of
-- the default chain): chain (names, in order), dir (operators' plugins, or nil), config
-- (name -> its settings), last_good (where good operator plugins are copied).
-- Fails closed: a plugin that cannot be loaded (nor its last good copy), whose settings
-- break its schema, whose _active raises, or a chain against a plugin's declared order
-- raises here (nginx refuses to start; `nginx -t` fails), naming the file and line or key.
-- Under a HUP an unloadable plugin becomes unloaded(name) instead; an order violation
-- still raises (nginx keeps the chain in force).
function _M.init(opts)
    local names = type(opts) == "table" and opts.chain
    if type(names) ~= "table" then
        error("zccp.core.pipeline.init: no plugins.chain in the settings nginx was given "
              .. "(render the config with zccp-nginx render: it always writes the chain)", 2)
    end
    local conf = opts.config or {}
    local hup, started = reloading()
    load_errors, loaded = {}, {}
    local refused, mods, files, confs, actives = {}, {}, {}, {}, {}
    for i, name in ipairs(names) do
        local mod, file, err, bad = loader.load(name, opts.dir, opts.last_good, is_builtin(name), IS_PHASE, _M.PHASES)
        local c, active = nil, true
        if mod then
            local cerr
            c, cerr = loader.settings(mod, conf[name], file)
            if not c then
                mod, err = nil, cerr
            end
        end
        if mod and type(mod._active) == "function" then
            local ok, on = pcall(mod._active, c)
            if not ok then   -- a broken _active: refused like a plugin that fails to load
                mod, err = nil, file .. ": _active: " .. tostring(on)
            end
            active = on and true or false
        end
        if err then
            load_errors[#load_errors + 1] = { plugin = name, file = bad or file, message = err }
            ngx_log(ngx_ERR, "zccp: plugin ", name, " refused: ", err,
                    mod and ("; the last good copy stays in force (" .. file .. ")") or "")
        end
        if not mod then
            refused[#refused + 1] = err
            mod, c, active = unloaded(name), {}, true
        end
        mods[i], files[i], confs[i], actives[i] = mod, file, c, active
    end
    if #refused > 0 and not hup then
        error("zccp: plugins refused (no good copy in force): " .. concat(refused, "; "), 0)
    end
    local order_err = loader.order(mods, files)
    if order_err then
        error("zccp: plugins.chain refused: " .. order_err, 0)
    end
    for _, p in ipairs(_M.PHASES) do
        chains[p] = { n = 0, fns = {}, confs = {}, names = {} }
    end
    local provided = {}
    for i, mod in ipairs(mods) do
        local phases, active = {}, actives[i]
        for _, p in ipairs(_M.PHASES) do
            local fn = mod[p]
            if fn and active then
                local c = chains[p]
                c.n = c.n + 1
                c.fns[c.n], c.confs[c.n], c.names[c.n] = fn, confs[i], mod.name
                phases[#phases + 1] = p
            end
        end
        if active and type(mod._provides) == "table" then
            for k, fn in pairs(mod._provides) do
                provided[k] = fn
            end
        end
        loaded[#loaded + 1] = { name = mod.name, file = files[i], phases = phases, active = active }
    end
    for _, p in ipairs(_M.PHASES) do
        compile(p, chains[p])
    end
    for k in pairs(hooks) do
        hooks[k] = nil
    end
    for k, fn in pairs(provided) do
        hooks[k] = fn
    end
    if started then
        started:set(STARTED, true)
    end
    return loaded, load_errors
end

-- For /health: the chain in force and what was refused at the last (re)load.
function _M.status()
    local empty = require("cjson.safe").empty_array_mt   -- [] in JSON when nothing was refused
    return { chain = setmetatable(loaded, empty), errors = setmetatable(load_errors, empty) }
end

return _M
