-- Plugins' own fields in a request's usage line (auth.usage_log; the line is written by
-- the limits plugin in the log phase): the public helper for plugins, docs/plugins.md.
--
--   local usage_fields = require "zccp.lib.usage_fields"
--   local ok, err = usage_fields.add(r, "team", ngx.var.http_x_team)
--
-- A field never overwrites the line's own (ts, tenant, ...) nor one added before; a name is
-- lower case letters, digits and _; a string value is written as valid UTF-8 whatever bytes
-- it holds (an invalid sequence becomes U+FFFD), as the rest of the line is.
local cjson = require "cjson.safe"

local type = type
local encode = cjson.encode
local str_find = string.find
local str_byte = string.byte
local str_sub = string.sub
local concat = table.concat

local _M = {}

-- The line's own keys (zccp.plugins.limits.usage_log.line): a plugin may not write them again.
local BUILTIN = { ts = true, request_id = true, key_id = true, tenant = true, api = true, status = true,
                  cache = true, input_tokens = true, output_tokens = true, saved_tokens = true }
_M.BUILTIN = BUILTIN
local MAX_VALUE = 1024   -- bytes of a string value kept

-- s with every byte sequence that is not UTF-8 replaced by U+FFFD.
local function valid_utf8(s)
    if not str_find(s, "[\128-\255]") then
        return s
    end
    local out, n, i, len = {}, 0, 1, #s
    while i <= len do
        local c = str_byte(s, i)
        local need = c < 0x80 and 0 or (c >= 0xC2 and c <= 0xDF) and 1 or (c >= 0xE0 and c <= 0xEF) and 2
                     or (c >= 0xF0 and c <= 0xF4) and 3 or -1
        local ok = need >= 0 and i + need <= len
        for k = 1, ok and need or 0 do
            local b = str_byte(s, i + k)
            if b < 0x80 or b > 0xBF then
                ok = false
                break
            end
        end
        if ok and need >= 2 then   -- no overlong form, no surrogate, nothing past U+10FFFF
            local b1 = str_byte(s, i + 1)
            if (c == 0xE0 and b1 < 0xA0) or (c == 0xED and b1 > 0x9F) or (c == 0xF0 and b1 < 0x90)
               or (c == 0xF4 and b1 > 0x8F) then
                ok = false
            end
        end
        n = n + 1
        if ok then
            out[n] = str_sub(s, i, i + need)
            i = i + need + 1
        else
            out[n] = "\239\191\189"
            i = i + 1
        end
    end
    local valid = concat(out)
    return valid
end
_M.valid_utf8 = valid_utf8

-- Adds "key":value to request r's usage line (a request with an API key, auth.usage_log
-- set). value: a string, number or boolean. Returns true, or nil, why (no record for this
-- request, a built-in or repeated key, a bad name or value). Call it once limits admitted
-- (prepare after limits, or later).
function _M.add(r, key, value)
    if type(key) ~= "string" or not str_find(key, "^[a-z][a-z0-9_]*$") or #key > 64 then
        return nil, "usage field name must be lower case letters, digits and _ (at most 64)"
    end
    if BUILTIN[key] then
        return nil, "usage field " .. key .. " is the usage line's own: name the plugin's field otherwise"
    end
    local tv = type(value)
    if tv == "string" then
        value = valid_utf8(#value > MAX_VALUE and str_sub(value, 1, MAX_VALUE) or value)
    elseif tv ~= "number" and tv ~= "boolean" then
        return nil, "usage field " .. key .. ": a string, number or boolean"
    end
    local t = r.limits   -- the limits plugin's record of this request
    if not t then
        return nil, "no usage record for this request"
    end
    local seen = t.field_names
    if not seen then
        seen = {}
        t.field_names = seen
    elseif seen[key] then
        return nil, "usage field " .. key .. " is already set for this request"
    end
    seen[key] = true
    t.fields = (t.fields or "") .. "," .. encode(key) .. ":" .. encode(value)
    return true
end

return _M
