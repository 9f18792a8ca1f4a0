-- The prompt text the CSF reads (docs/fingerprint.md §3): `role: text\n` per entry,
-- from a decoded, masked request, written into a string.buffer.
-- engine/zccp/cache/fp/prompt.py is the same rule in Python, byte for byte.
--
--   local prompt = require "zccp.fp.prompt"
--   prompt.write(buf, api, doc)   -- buf: a string.buffer (reset first)
local null = require("cjson").null

local type = type
local next = next

local _M = { _VERSION = "0.1.0" }

local function put_text(buf, content)
    local tc = type(content)
    if tc == "string" then
        buf:put(content)
        return
    end
    if content == nil or content == null then
        return
    end
    if tc ~= "table" or (content[1] == nil and next(content) ~= nil) then
        buf:put("[?]")   -- not an array
        return
    end
    for i = 1, #content do
        if i > 1 then
            buf:put("\n")
        end
        local blk = content[i]
        local t = type(blk) == "table" and blk[1] == nil and blk.type or nil
        if type(t) == "string" then
            local txt = blk.text
            if t == "text" and type(txt) == "string" then
                buf:put(txt)
            else
                buf:put("[", t, "]")
            end
        else
            buf:put("[?]")
        end
    end
end

local function put_entry(buf, role, content)
    if type(role) ~= "string" then
        role = "?"
    end
    buf:put(role, ": ")
    put_text(buf, content)
    buf:put("\n")
end

local EMPTY = {}

-- Writes the prompt text of `doc` (decoded, masked) into buf (reset first).
function _M.write(buf, api, doc)
    buf:reset()
    local msgs = doc.messages
    if type(msgs) ~= "table" or (msgs[1] == nil and next(msgs) ~= nil) then
        msgs = EMPTY   -- not an array: no messages
    end
    if api == "anthropic" then
        local system = doc.system
        if system ~= nil and system ~= null then
            put_entry(buf, "system", system)
        end
        for i = 1, #msgs do
            local m = msgs[i]
            if type(m) == "table" and m[1] == nil then
                put_entry(buf, m.role, m.content)
            else
                put_entry(buf, nil, "[?]")
            end
        end
    else
        -- the system and developer messages first, then all the others, each in order
        for i = 1, #msgs do
            local m = msgs[i]
            if type(m) == "table" and m[1] == nil then
                local role = m.role
                if role == "system" or role == "developer" then
                    put_entry(buf, role, m.content)
                end
            end
        end
        for i = 1, #msgs do
            local m = msgs[i]
            if type(m) == "table" and m[1] == nil then
                local role = m.role
                if role ~= "system" and role ~= "developer" then
                    put_entry(buf, role, m.content)
                end
            else
                put_entry(buf, nil, "[?]")
            end
        end
    end
end

return _M
