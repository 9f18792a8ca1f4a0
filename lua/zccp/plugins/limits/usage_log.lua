-- One JSON line per request answered with a key (auth.usage_log; docs/keys.md), for billing
-- pipelines: time, request id, key id, tenant, API, status, cache verdict, the engine's exact
-- input and output tokens (0 for a cache hit) and the tokens a hit saved. The master opens
-- the file when it loads this module at start-up (init_by_lua loads the handler; as root
-- under a distribution's nginx, so the workers need no write access to its directory); each
-- worker appends to that one descriptor (O_APPEND, unbuffered: one write per flush of its
-- queued lines, zccp.plugins.limits.admit).
local cjson = require "cjson.safe"
local settings = require "zccp.settings"

local ngx = ngx
local io_open = io.open
local concat = table.concat
local setmetatable = setmetatable
local str_find = string.find
local cjson_encode = cjson.encode
local ngx_now = ngx.now

local _M = { _VERSION = "0.1.0" }

local file, opened_path

local function handle()
    local auth = settings.get().auth
    local path = auth and auth.usage_log
    if not path or path == "" then
        return nil
    end
    if file and opened_path == path then
        return file
    end
    local f, err = io_open(path, "a")
    if not f then
        ngx.log(ngx.ERR, "zccp: usage log ", path, ": ", err)
        return nil
    end
    f:setvbuf("no")
    file, opened_path = f, path
    return f
end

-- Opened now when the settings are (init_by_lua, in the master).
if settings.abi_header() then
    handle()
end

-- Whether lines are written (auth.usage_log set): settle() builds none otherwise.
function _M.enabled()
    local auth = settings.get().auth
    local path = auth and auth.usage_log
    return path ~= nil and path ~= ""
end

-- A string as a JSON value: as it is between quotes when nothing in it needs escaping.
local function json_string(s)
    if not str_find(s, '[%c"\\\128-\255]') then
        return '"' .. s .. '"'
    end
    return cjson_encode(s)
end

-- The key's part of its lines ("key_id":...,"tenant":...), made once per cached record.
local function key_part(who)
    local p = who.zccp_usage_part
    if not p then
        p = '"key_id":' .. json_string(who.id) .. ',"tenant":' .. json_string(who.tenant)
        who.zccp_usage_part = p
    end
    return p
end

-- The API's and the cache verdict's parts: from small fixed sets, each made once.
local API_PART = setmetatable({}, { __index = function(t, api)
    local p = ',"api":' .. json_string(api) .. ',"status":'
    t[api] = p
    return p
end })
local CACHE_PART = setmetatable({}, { __index = function(t, cache)
    local p = ',"cache":' .. (cache ~= "" and json_string(cache) or "null") .. ',"input_tokens":'
    t[cache] = p
    return p
end })

-- The request id as a JSON value. Its characters are printable ASCII (zccp_request_id's
-- map): only a quote or a backslash needs escaping (plain finds, which LuaJIT compiles).
local function rid_json(rid)
    if not rid then
        return "null"
    end
    if str_find(rid, '"', 1, true) or str_find(rid, "\\", 1, true) then
        return cjson_encode(rid)
    end
    return '"' .. rid .. '"'
end

-- One request's line (t: its zccp.plugins.limits.admit ticket; rid: its request id; cache: its
-- X-ZCCP-Cache verdict, or nil), without the newline: one concatenation, no table.
function _M.line(t, rid, status, input, output, saved, cache)
    return '{"ts":' .. ngx_now() .. ',"request_id":' .. rid_json(rid) .. ',' .. key_part(t.who)
        .. API_PART[t.api] .. status .. CACHE_PART[cache or ""] .. input .. ',"output_tokens":' .. output
        .. ',"saved_tokens":' .. saved .. (t.fields or "") .. '}'   -- t.fields: plugins' (zccp.plugins.usage)
end

-- Several lines in one write (zccp.plugins.limits.admit flushes them together).
function _M.write_lines(lines)
    local f = handle()
    if not f or #lines == 0 then
        return
    end
    -- one string, so one write(2): unbuffered, two arguments are two writes, and another
    -- worker's lines (O_APPEND, the same file) could land between a line and its newline
    f:write(concat(lines, "\n") .. "\n")
end

return _M
