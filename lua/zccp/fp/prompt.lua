-- The final user turn (docs/fingerprint.md §3): the text the CSF reads, when the last
-- message of a decoded, masked request is a user turn of text only. Everything before
-- it is covered exactly by the prefix key (zccp.fp.canonical), so near-duplicates are
-- judged on this turn alone. engine/zccp/cache/fp/prompt.py is the same rule in Python.
--
--   local prompt = require "zccp.fp.prompt"
--   local p, n = prompt.final_turn(buf, doc)   -- buf: a string.buffer for joined blocks
--   -- p, n: the turn's text (a Lua string or a pointer into buf) and its length,
--   -- or nil when the request is exact-only (no text-only final user turn)
local T = require "zccp.fp.tables"

local type = type
local next = next
local ipairs = ipairs

local _M = { _VERSION = "0.2.0" }

local function key_set(list)
    local s = {}
    for _, k in ipairs(list) do
        s[k] = true
    end
    return s
end

local TURN_KEYS = key_set(T.turn_keys)
local TEXT_BLOCK_KEYS = key_set(T.text_block_keys)

-- true when every member name of table t is in `allowed`
local function only(t, allowed)
    for k in next, t do
        if not allowed[k] then
            return false
        end
    end
    return true
end

function _M.final_turn(buf, doc)
    local msgs = doc.messages
    if type(msgs) ~= "table" then
        return nil
    end
    local last = msgs[#msgs]
    -- an object (a decoded JSON object has no [1]) with role "user" and nothing else but content
    if type(last) ~= "table" or last[1] ~= nil or last.role ~= "user" or not only(last, TURN_KEYS) then
        return nil
    end
    local content = last.content
    if type(content) == "string" then
        return content, #content
    end
    if type(content) ~= "table" or content[1] == nil then
        return nil   -- null, a number, an object, or no blocks at all
    end
    buf:reset()
    for i = 1, #content do
        local blk = content[i]
        if type(blk) ~= "table" or blk[1] ~= nil or blk.type ~= "text" or type(blk.text) ~= "string"
            or not only(blk, TEXT_BLOCK_KEYS) then
            return nil   -- an image, a document, a tool result, ...: exact-only
        end
        if i > 1 then
            buf:put("\n")
        end
        buf:put(blk.text)
    end
    return buf:ref()
end

return _M
