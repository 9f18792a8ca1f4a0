-- One JSON line per request answered with a key (auth.usage_log; docs/keys.md), for billing
-- pipelines: time, request id, key id, tenant, API, status, cache verdict, the engine's exact
-- input and output tokens (0 for a cache hit) and the tokens a hit saved. The master opens
-- the file when it loads this module at start-up (init_by_lua loads the handler; as root
-- under a distribution's nginx, so the workers need no write access to its directory); each
-- worker appends to that one descriptor (O_APPEND, unbuffered: one write per flush of its
-- queued lines, zccp.limits).
local cjson = require "cjson.safe"
local settings = require "zccp.settings"

local ngx = ngx
local io_open = io.open
local concat = table.concat

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

-- One request's line (t: its zccp.limits ticket), without the newline.
function _M.line(t, status, input, output, saved, cache)
    return cjson.encode({ ts = ngx.now(), request_id = t.request_id, key_id = t.who.id, tenant = t.who.tenant,
                          api = t.api, status = status, cache = cache ~= "" and cache or cjson.null,
                          input_tokens = input, output_tokens = output, saved_tokens = saved })
end

-- Several lines in one write (zccp.limits flushes them together).
function _M.write_lines(lines)
    local f = handle()
    if not f or #lines == 0 then
        return
    end
    f:write(concat(lines, "\n"), "\n")
end

return _M
