-- The plugin chain: config.yaml's plugins.chain, built once at init into one array of
-- functions per phase (a phase no plugin implements is an empty array: one compare). A
-- plugin whose _active(conf) says false (its feature is off in this config) is listed
-- but not in any phase: a request pays nothing for it.
-- A plugin ends a request by answering it through zccp.core.answer and returning DONE;
-- a plugin that raises is that request's 500 and zccp_nginx_plugin_errors_total{plugin}.
-- Operators' plugins come from plugins.dir; one that fails to load is refused with its
-- file and line, and the last good chain (copied beside it, like the masks') stays.
local metrics = require "zccp.metrics"
local errors = require "zccp.errors"

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local pcall = pcall
local type = type
local pairs = pairs
local ipairs = ipairs
local tostring = tostring
local loadfile = loadfile
local io_open = io.open
local concat = table.concat
local load = load
local assert = assert
local setmetatable = setmetatable

local _M = { _VERSION = "0.1.0" }

-- What a plugin returns when it answered the request: the chain stops there.
local DONE = "zccp.done"
_M.DONE = DONE

-- The phases, in request order (docs/plugins.md). wants_body is asked before the body
-- is read: true from any plugin reads it whole instead of streaming it into the slot.
_M.PHASES = { "access", "wants_body", "prepare", "keys", "route", "filled", "headers", "relayed", "log" }
local IS_PHASE = {}
for _, p in ipairs(_M.PHASES) do
    IS_PHASE[p] = true
end

local chains = {}        -- phase -> { n, fns, confs, names }
local loaded = {}        -- the chain in force: { { name, file, phases } }
local load_errors = {}   -- { { plugin, file, message } }: refused at the last (re)load

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
    return DONE
end

-- Each phase's runner, made once per chain (compile): its plugins' calls one after the
-- other, no loop (a loop of one to three turns is where LuaJIT's root traces give up).
local runners = {}

-- The source of one phase's runner, calling plugins 1..n. kind "run": DONE once a plugin
-- answered (or raised), else nil; "any": true once a plugin says so; "log": every plugin.
local function source(kind, n)
    local out = { "local pcall, failed, DONE, fns, confs, names = ...\n" }
    if kind == "log" then
        out[#out + 1] = "return function(api)\n local ok, err\n"
    else
        out[#out + 1] = "return function(r, a1, a2, a3)\n local ok, res\n"
    end
    for i = 1, n do
        if kind == "run" then
            out[#out + 1] = (" ok, res = pcall(fns[%d], r, confs[%d], a1, a2, a3)\n"
                .. " if not ok then return failed(r, names[%d], res) end\n"
                .. " if res == DONE then return DONE end\n"):format(i, i, i)
        elseif kind == "any" then
            out[#out + 1] = (" ok, res = pcall(fns[%d], r, confs[%d])\n"
                .. " if ok and res then return true elseif not ok then failed(nil, names[%d], res) end\n"):format(i, i, i)
        else
            out[#out + 1] = (" ok, err = pcall(fns[%d], api, confs[%d])\n"
                .. " if not ok then failed(nil, names[%d], err) end\n"):format(i, i, i)
        end
    end
    out[#out + 1] = kind == "any" and " return false\nend\n" or "end\n"
    local src = concat(out)
    return src
end

local function compile(phase, c)
    local kind = phase == "wants_body" and "any" or phase == "log" and "log" or "run"
    local chunk = assert(load(source(kind, c.n), "=zccp.core.pipeline[" .. phase .. "]"))
    runners[phase] = chunk(pcall, failed, DONE, c.fns, c.confs, c.names)
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

-- log_by_lua of the API locations (api nil: the models location, no request metrics).
function _M.log(api)
    return runners.log(api)
end

local function read(path)
    local f = io_open(path, "rb")
    if not f then
        return nil
    end
    local s = f:read("*a")
    f:close()
    return s
end

local function write(path, s)
    local f = io_open(path, "wb")
    if f then
        f:write(s)
        f:close()
    end
end

-- A plugin module checked against the interface: a table, name = its chain name, only
-- known phases, each a function. Returns the module, or nil, "file:line: why".
local function check(mod, name, file)
    if type(mod) ~= "table" then
        return nil, file .. ": the plugin must return a table (local _M = { name = ... }; return _M)"
    end
    if mod.name ~= name then
        return nil, file .. ": name is " .. tostring(mod.name) .. ", the chain names it " .. name
    end
    for k, v in pairs(mod) do
        if type(v) == "function" and not IS_PHASE[k] and k:sub(1, 1) ~= "_" then
            local info = debug.getinfo(v, "S")
            return nil, file .. ":" .. (info.linedefined or 0) .. ": " .. k .. " is not a phase (phases: "
                .. concat(_M.PHASES, ", ") .. "; helpers start with _)"
        end
    end
    return mod
end

-- An operator's plugin from file: loadfile names the file and line of a syntax error,
-- pcall those of an error while it loads.
local function load_file(file, name)
    local chunk, err = loadfile(file)
    if not chunk then
        return nil, err
    end
    local ok, mod = pcall(chunk)
    if not ok then
        return nil, tostring(mod)
    end
    return check(mod, name, file)
end

local function load_one(name, dir, last_good)
    local file = dir and dir ~= "" and (dir .. "/" .. name .. ".lua")
    if file and read(file) then
        local mod, err = load_file(file, name)
        if mod then
            if last_good then
                write(last_good .. "/" .. name .. ".lua", read(file))
            end
            return mod, file
        end
        load_errors[#load_errors + 1] = { plugin = name, file = file, message = err }
        ngx_log(ngx_ERR, "zccp: plugin ", name, " refused: ", err)
        local kept = last_good and last_good .. "/" .. name .. ".lua"
        if kept and read(kept) then
            mod = load_file(kept, name)
            if mod then
                ngx_log(ngx_ERR, "zccp: plugin ", name, ": the last good copy stays in force (", kept, ")")
                return mod, kept
            end
        end
        return nil
    end
    local ok, mod = pcall(require, "zccp.plugins." .. name)
    if not ok then
        load_errors[#load_errors + 1] = { plugin = name, file = file or ("zccp/plugins/" .. name .. ".lua"),
                                          message = tostring(mod) }
        ngx_log(ngx_ERR, "zccp: plugin ", name, " not found: ", tostring(mod))
        return nil
    end
    return check(mod, name, "zccp/plugins/" .. name .. ".lua")
end

-- opts (settings.plugins, rendered from engine/zccp/plugins_config.py, the one source of
-- the default chain): chain (names, in order), dir (operators' plugins, or nil), config
-- (name -> its settings), last_good (where good operator plugins are copied).
function _M.init(opts)
    local names = type(opts) == "table" and opts.chain
    if type(names) ~= "table" then
        error("zccp.core.pipeline.init: no plugins.chain in the settings nginx was given "
              .. "(render the config with zccp-nginx render: it always writes the chain)", 2)
    end
    local conf = opts.config or {}
    load_errors, loaded = {}, {}
    for _, p in ipairs(_M.PHASES) do
        chains[p] = { n = 0, fns = {}, confs = {}, names = {} }
    end
    for _, name in ipairs(names) do
        local mod, file = load_one(name, opts.dir, opts.last_good)
        if mod then
            local phases = {}
            local active, why = true
            if type(mod._active) == "function" then
                active, why = pcall(mod._active, conf[name] or {})
                if not active then   -- a broken _active: refused like a plugin that fails to load
                    load_errors[#load_errors + 1] = { plugin = name, file = file, message = tostring(why) }
                    ngx_log(ngx_ERR, "zccp: plugin ", name, " refused: ", tostring(why))
                end
                active = active and why and true or false
            end
            for _, p in ipairs(_M.PHASES) do
                local fn = mod[p]
                if fn and active then
                    local c = chains[p]
                    c.n = c.n + 1
                    c.fns[c.n], c.confs[c.n], c.names[c.n] = fn, conf[name] or {}, name
                    phases[#phases + 1] = p
                end
            end
            loaded[#loaded + 1] = { name = name, file = file, phases = phases, active = active }
        end
    end
    for _, p in ipairs(_M.PHASES) do
        compile(p, chains[p])
    end
    return loaded, load_errors
end

-- For /health: the chain in force and what was refused at the last (re)load.
function _M.status()
    local empty = require("cjson.safe").empty_array_mt   -- [] in JSON when nothing was refused
    return { chain = setmetatable(loaded, empty), errors = setmetatable(load_errors, empty) }
end

return _M
