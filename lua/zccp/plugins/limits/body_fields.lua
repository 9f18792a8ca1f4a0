-- The few top-level members of a JSON body that the output reservation reads
-- (zccp.plugins.limits.reserve: max_tokens, max_completion_tokens, max_output_tokens, n, and how
-- many prompts `prompt` holds), read in one pass over the bytes instead of a cjson.decode
-- of the whole body: no table or string is made per member, so a body costs no garbage
-- (a decode per new body, and its collection, cost more: bench/keys_bodies2000.md). Written by hand: neither cjson nor the OpenResty libraries
-- read one member of a document without building all of it.
--
-- Exact for well-formed JSON: strings are skipped by their escapes, nesting is counted, a
-- member named twice keeps its last value (as cjson's table does). Whatever it cannot read
-- as cjson would returns nil, and the caller decodes the body: a member name with an escape
-- (cjson reads "max\u005ftokens" as max_tokens), a wanted value that is a string with an
-- escape or a number cjson reads and Lua's tonumber may not (NaN, Infinity, hex, "+1"),
-- nesting deeper than MAX_DEPTH, bytes after the object, a body that ends inside it.
-- A malformed body it does read (it does not check every token) is the engine's to refuse.
--
--   local ok, max_tokens, max_completion_tokens, max_output_tokens, n, prompts = body_fields.read(body)
--   -- ok nil: decode the body instead; else each value as tonumber(doc.member) would give it
--   -- (nil where absent, null, a bool, an object or an array), prompts: #doc.prompt when it is
--   -- an array whose first element is not a number, else 0
--   body_fields.of_doc(doc)   -- the same five from a decoded body (cjson's table)
local ffi = require "ffi"

local type = type
local tonumber = tonumber
local str_sub = string.sub
local ffi_cast = ffi.cast
local u8p = ffi.typeof("const uint8_t *")
local C = ffi.C
require "zccp.lib.libc"   -- strcspn
local STOPS = '"\\'   -- what ends a run of a string's plain bytes: a quote, a backslash

local _M = { _VERSION = "0.1.0" }

-- Below cjson's own limit (decode_max_depth, 1000): deeper bodies are cjson's to refuse.
local MAX_DEPTH = 500

local QUOTE, BACKSLASH, COLON, COMMA = 34, 92, 58, 44
local LBRACE, RBRACE, LBRACKET, RBRACKET = 123, 125, 91, 93

local function is_space(c)
    return c == 32 or c == 10 or c == 13 or c == 9
end

local function skip_space(p, i, n)
    while i < n and is_space(p[i]) do
        i = i + 1
    end
    return i
end

-- The index after the string whose opening quote is at i, and whether it holds an escape;
-- nil when the body ends inside it. libc's strcspn finds the next quote or backslash (most
-- of a body's bytes are inside strings): a body string is NUL-terminated, and a NUL inside
-- it is passed over as any other byte.
local function string_end(p, i, n)
    local escaped = false
    i = i + 1
    while i < n do
        i = i + tonumber(C.strcspn(p + i, STOPS))
        if i >= n then
            return nil
        end
        local c = p[i]
        if c == QUOTE then
            return i + 1, escaped
        end
        if c == BACKSLASH then
            escaped = true
            i = i + 2
        else   -- a NUL byte
            i = i + 1
        end
    end
    return nil
end

-- The index after the array or object that opens at i (brackets counted, strings
-- skipped), and, for an array, how many elements it holds at its own level; nil when the
-- body ends inside it or it nests past MAX_DEPTH.
local function container_end(p, i, n)
    local depth, elements, empty = 1, 0, true
    i = i + 1
    while i < n do
        local c = p[i]
        if c == QUOTE then
            if depth == 1 then
                empty = false
            end
            i = string_end(p, i, n)
            if not i then
                return nil
            end
        else
            if c == LBRACE or c == LBRACKET then
                if depth == 1 then
                    empty = false
                end
                depth = depth + 1
                if depth > MAX_DEPTH then
                    return nil
                end
            elseif c == RBRACE or c == RBRACKET then
                depth = depth - 1
                if depth == 0 then
                    return i + 1, empty and 0 or elements + 1
                end
            elseif depth == 1 then
                if c == COMMA then
                    elements = elements + 1
                elseif not is_space(c) then
                    empty = false
                end
            end
            i = i + 1
        end
    end
    return nil
end

-- The index after the scalar (number, true, false, null) that starts at i.
local function scalar_end(p, i, n)
    while i < n do
        local c = p[i]
        if c == COMMA or c == RBRACE or c == RBRACKET or is_space(c) then
            break
        end
        i = i + 1
    end
    return i
end

-- A wanted member's value, as tonumber(cjson's value) gives it: a number or nil; false:
-- the body is cjson's to read (an escaped string, a number token Lua may read otherwise).
local function number_of(p, body, i, j)
    local c = p[i]
    if c == QUOTE then
        local e, escaped = string_end(p, i, j)
        if escaped or e ~= j then
            return false
        end
        local n = tonumber(str_sub(body, i + 2, j - 1))
        return n
    end
    if c == LBRACE or c == LBRACKET then
        return nil
    end
    local tok = str_sub(body, i + 1, j)
    if tok == "null" or tok == "true" or tok == "false" then
        return nil
    end
    if tok:find("^%-?%d+%.?%d*[eE]?[%+%-]?%d*$") then   -- a plain JSON number (strtod and tonumber agree)
        local n = tonumber(tok)
        return n
    end
    return false
end

-- Which wanted member the name at p[i .. i + len) is: 1 max_tokens, 2 max_completion_tokens,
-- 3 max_output_tokens, 4 n, 5 prompt; 0 none (lengths first: no string is made).
local NAMES = { "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "prompt" }
local BY_LEN = {}
for k, name in ipairs(NAMES) do
    BY_LEN[#name] = k
end

local function wanted(body, i, len)
    local k = BY_LEN[len]
    if k and str_sub(body, i + 1, i + len) == NAMES[k] then
        return k
    end
    return 0
end

function _M.read(body)
    local n = #body
    local p = ffi_cast(u8p, body)
    local i = skip_space(p, 0, n)
    if i >= n or p[i] ~= LBRACE then
        return nil
    end
    local v1, v2, v3, v4, prompts = nil, nil, nil, nil, 0
    i = skip_space(p, i + 1, n)
    if i < n and p[i] == RBRACE then
        i = i + 1
    else
        while true do
            if i >= n or p[i] ~= QUOTE then
                return nil
            end
            local name_end, escaped = string_end(p, i, n)
            if not name_end or escaped then
                return nil
            end
            local k = wanted(body, i + 1, name_end - i - 2)
            i = skip_space(p, name_end, n)
            if i >= n or p[i] ~= COLON then
                return nil
            end
            i = skip_space(p, i + 1, n)
            if i >= n then
                return nil
            end
            local c, count = p[i], 0
            local j
            if c == QUOTE then
                j = string_end(p, i, n)
            elseif c == LBRACE or c == LBRACKET then
                j, count = container_end(p, i, n)
            else
                j = scalar_end(p, i, n)
            end
            if not j or j == i then
                return nil
            end
            if k == 5 then
                -- #prompt counts when it is an array whose first element is not a number
                local first = c == LBRACKET and p[skip_space(p, i + 1, n)] or nil
                if first and first ~= QUOTE and first ~= LBRACE and first ~= LBRACKET and first ~= RBRACKET
                        and first ~= 110 and first ~= 116 and first ~= 102 then   -- n(ull) t(rue) f(alse)
                    prompts = 0   -- a number first (or a token cjson may read as one): one prompt
                    if not (first == 45 or (first >= 48 and first <= 57)) then   -- '-', digits
                        return nil
                    end
                else
                    prompts = c == LBRACKET and count or 0
                end
            elseif k > 0 then
                local v = number_of(p, body, i, j)
                if v == false then
                    return nil
                end
                if k == 1 then
                    v1 = v
                elseif k == 2 then
                    v2 = v
                elseif k == 3 then
                    v3 = v
                else
                    v4 = v
                end
            end
            i = skip_space(p, j, n)
            if i >= n then
                return nil
            end
            c = p[i]
            if c == RBRACE then
                i = i + 1
                break
            end
            if c ~= COMMA then
                return nil
            end
            i = skip_space(p, i + 1, n)
        end
    end
    if skip_space(p, i, n) ~= n then
        return nil
    end
    return true, v1, v2, v3, v4, prompts
end

-- The same members from a body cjson decoded (a body read() left to the decode).
function _M.of_doc(doc)
    local p = doc.prompt
    local prompts = (type(p) == "table" and type(p[1]) ~= "number") and #p or 0
    return tonumber(doc.max_tokens), tonumber(doc.max_completion_tokens), tonumber(doc.max_output_tokens),
           tonumber(doc.n), prompts
end

return _M
