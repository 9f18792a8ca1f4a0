-- Loading the plugin chain (zccp.core.pipeline.init): each plugin from its file (a built-in
-- from lua/zccp/plugins/, an operator's from plugins.dir, else its last good copy), checked
-- against the interface, its settings against its _M.schema, its place against its
-- _M.after / _M.before. Every refusal names the file (and line, or the key).
local type = type
local pairs = pairs
local next = next
local ipairs = ipairs
local pcall = pcall
local tostring = tostring
local load = load
local io_open = io.open
local concat = table.concat
local sort = table.sort
local math_floor = math.floor

local _M = {}

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
local function check(mod, name, file, is_phase, phases)
    if type(mod) ~= "table" then
        return nil, file .. ": the plugin must return a table (local _M = { name = ... }; return _M)"
    end
    if mod.name ~= name then
        return nil, file .. ": name is " .. tostring(mod.name) .. ", the chain names it " .. name
    end
    for k, v in pairs(mod) do
        if type(v) == "function" and not is_phase[k] and k:sub(1, 1) ~= "_" then
            local info = debug.getinfo(v, "S")
            return nil, file .. ":" .. (info.linedefined or 0) .. ": " .. k .. " is not a phase (phases: "
                .. concat(phases, ", ") .. "; helpers start with _)"
        end
    end
    for _, k in ipairs({ "after", "before" }) do
        local v = mod[k]
        if v ~= nil and type(v) ~= "table" then
            return nil, file .. ": " .. k .. " must be a list of plugin names"
        end
    end
    if mod.schema ~= nil and type(mod.schema) ~= "table" then
        return nil, file .. ": schema must be a table of setting name -> { type = ..., ... }"
    end
    return mod
end

-- An operator's plugin from file, its chunk named NAME.lua (Lua cuts a long path short in
-- its messages); a syntax error or a raise while it loads is named by the whole path and line.
local function load_file(file, name, is_phase, phases)
    local src = read(file)
    local short = name .. ".lua"
    local chunk, err = load(src or "", "=" .. short)
    if not chunk then
        return nil, file .. tostring(err):sub(#short + 1)
    end
    local ok, mod = pcall(chunk)
    if not ok then
        local msg = tostring(mod)
        if msg:sub(1, #short + 1) == short .. ":" then
            msg = file .. msg:sub(#short + 1)
        end
        return nil, msg
    end
    return check(mod, name, file, is_phase, phases)
end

-- Returns mod, file (the file in force), err (why the operator's file was refused, also
-- when its last good copy stands in), the refused file; or nil, file, err when nothing can
-- be loaded.
function _M.load(name, dir, last_good, builtin, is_phase, phases)
    local file = dir and dir ~= "" and (dir .. "/" .. name .. ".lua") or nil
    if builtin then
        if file and read(file) then   -- an operator's file never takes a built-in's name
            return nil, file, file .. ": " .. name .. " is a built-in plugin's name; "
                .. "name the operator's plugin otherwise"
        end
        local bfile = "zccp/plugins/" .. name .. ".lua"
        local ok, mod = pcall(require, "zccp.plugins." .. name)
        if not ok then
            return nil, bfile, tostring(mod)
        end
        local err
        mod, err = check(mod, name, bfile, is_phase, phases)
        return mod, bfile, err
    end
    if not file then
        return nil, name .. ".lua", name .. ": not a built-in plugin and plugins.dir is not set"
    end
    local src = read(file)
    local mod, err
    if src then
        mod, err = load_file(file, name, is_phase, phases)
        if mod then
            if last_good then
                write(last_good .. "/" .. name .. ".lua", src)
            end
            return mod, file
        end
    else
        err = file .. ": no such file"
    end
    local kept = last_good and last_good .. "/" .. name .. ".lua"
    if kept and read(kept) then
        mod = load_file(kept, name, is_phase, phases)
        if mod then
            return mod, kept, err, file
        end
    end
    return nil, file, err
end

local CHECKS = {
    string = function(v) return type(v) == "string" end,
    number = function(v) return type(v) == "number" end,
    integer = function(v) return type(v) == "number" and math_floor(v) == v end,
    boolean = function(v) return type(v) == "boolean" end,
}

local function sorted_keys(t)
    local out = {}
    for k in pairs(t) do
        out[#out + 1] = tostring(k)
    end
    sort(out)
    local list = concat(out, ", ")
    return list
end

local function check_scalar(v, want, enum, where)
    local ok = CHECKS[want]
    if not ok then
        return nil, where .. ": the schema names an unknown type " .. tostring(want)
    end
    if not ok(v) then
        return nil, where .. ": expected " .. want .. ", got " .. tostring(v)
    end
    if enum then
        for _, e in ipairs(enum) do
            if e == v then
                return v
            end
        end
        return nil, where .. ": " .. tostring(v) .. " is not one of " .. concat(enum, ", ")
    end
    return v
end

local function copy(v)
    if type(v) ~= "table" then
        return v
    end
    local t = {}
    for k, x in pairs(v) do
        t[k] = x
    end
    return t
end

-- One setting against its field: { type = "string" | "number" | "integer" | "boolean" |
-- "array" | "map", items / values = a scalar type (array, map), enum, required, default }.
local function check_field(v, f, where)
    local t = f.type
    if t == "array" or t == "map" then
        if type(v) ~= "table" then
            return nil, where .. ": expected " .. (t == "array" and "a list" or "a mapping")
        end
        local n = #v
        for k, x in pairs(v) do
            local kw = where .. "." .. tostring(k)
            if t == "array" and (type(k) ~= "number" or k < 1 or k > n) then
                return nil, kw .. ": expected a list"
            end
            if t == "map" and type(k) ~= "string" then
                return nil, kw .. ": expected a mapping with names as keys"
            end
            local _, err = check_scalar(x, (t == "array" and f.items or f.values) or "string", f.enum, kw)
            if err then
                return nil, err
            end
        end
        return v
    end
    return check_scalar(v, t, f.enum, where)
end

-- A plugin's settings against its schema: unknown keys refused, required ones present,
-- defaults filled in. Returns the conf the phases get, or nil, "file: plugins.settings.x.key: why".
function _M.settings(mod, conf, file)
    local schema = mod.schema
    local where = "plugins.settings." .. mod.name
    conf = conf or {}
    if not schema then
        if next(conf) ~= nil then
            return nil, file .. ": " .. where .. ": " .. mod.name .. " takes no settings (it has no schema)"
        end
        return conf
    end
    local out = {}
    for k, v in pairs(conf) do
        local f = schema[k]
        if type(f) ~= "table" then
            return nil, file .. ": " .. where .. "." .. tostring(k) .. ": unknown setting (known: "
                .. sorted_keys(schema) .. ")"
        end
        local ok, err = check_field(v, f, where .. "." .. k)
        if ok == nil then
            return nil, file .. ": " .. err
        end
        out[k] = ok
    end
    for k, f in pairs(schema) do
        if out[k] == nil then
            if f.required then
                return nil, file .. ": " .. where .. "." .. k .. ": required"
            end
            out[k] = copy(f.default)
        end
    end
    return out
end

-- The chain's order against what each plugin declares (after / before another plugin of
-- the chain). Returns nil, or "why" naming both plugins.
function _M.order(mods, files)
    local pos = {}
    for i, m in ipairs(mods) do
        pos[m.name] = i
    end
    for i, m in ipairs(mods) do
        for _, other in ipairs(m.after or {}) do
            if pos[other] and pos[other] > i then
                return files[i] .. ": " .. m.name .. " must come after " .. other
                    .. " in plugins.chain (its after = { \"" .. other .. "\" })"
            end
        end
        for _, other in ipairs(m.before or {}) do
            if pos[other] and pos[other] < i then
                return files[i] .. ": " .. m.name .. " must come before " .. other
                    .. " in plugins.chain (its before = { \"" .. other .. "\" })"
            end
        end
    end
end

return _M
