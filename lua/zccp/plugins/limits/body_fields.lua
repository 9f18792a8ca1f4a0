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
local type = type
local tonumber = tonumber
local str_sub = string.sub
local str_byte = string.byte
local str_find = string.find
local ffi = require "ffi"
local ffi_cast = ffi.cast
local u8p = ffi.typeof("const uint8_t *")
local C = ffi.C
require "zccp.lib.libc"   -- strcspn
local STOPS = '"\\'   -- what ends a run of an escaped string's plain bytes: a quote, a backslash

local _M = { _VERSION = "0.2.0" }

-- Below cjson's own limit (decode_max_depth, 1000): deeper bodies are cjson's to refuse.
local MAX_DEPTH = 500

local QUOTE, BACKSLASH, COLON, COMMA = 34, 92, 58, 44
local LBRACE, RBRACE, LBRACKET, RBRACKET = 123, 125, 91, 93

-- Positions are 1-based (string.byte's). This runs once per request, much of it in LuaJIT's
-- interpreter, where an FFI call or a cdata index costs far more than a built-in: a string
-- without escapes (most of a body) is skipped by one plain string.find (memchr, in C);
-- libc's strcspn only walks the strings that hold escapes (bench/keys_cuts.md).

-- The position of the first byte at or after i that is not JSON whitespace, and that byte
-- (nil past the end).
local function skip_space(body, i)
    local c = str_byte(body, i)
    while c == 32 or c == 10 or c == 13 or c == 9 do
        i = i + 1
        c = str_byte(body, i)
    end
    return i, c
end

-- The body's next backslash at or after the current string's start (n + 1: none left): one
-- search over the body for every escape-free string, not one per string.
local next_bs = 0

-- The position after the string whose opening quote is at i, and whether it holds an
-- escape; nil when the body ends inside it.
local function string_end(body, i, n)
    local q = str_find(body, '"', i + 1, true)
    if not q then
        return nil
    end
    if next_bs <= i then
        next_bs = str_find(body, "\\", i + 1, true) or n + 1
    end
    if next_bs > q then   -- no escape inside (most strings)
        return q + 1, false
    end
    -- an escape inside: from it on, libc's strcspn finds each next quote or backslash (one
    -- call per escape, where two plain searches would be needed; the string is
    -- NUL-terminated, and a NUL inside the body is passed over as any other byte)
    local p = ffi_cast(u8p, body)
    local j = next_bs + 2   -- past the backslash and the byte it escapes
    while j <= n do
        j = j + tonumber(C.strcspn(p + j - 1, STOPS))
        if j > n then
            return nil
        end
        local c = p[j - 1]
        if c == QUOTE then
            next_bs = j   -- the next string searches again
            return j + 1, true
        end
        j = j + (c == BACKSLASH and 2 or 1)   -- else a NUL byte
    end
    return nil
end

-- The position after the array or object that opens at i (brackets counted, strings
-- skipped), and, for an array, how many elements it holds at its own level; nil when the
-- body ends inside it or it nests past MAX_DEPTH.
local function container_end(body, i, n)
    local depth, elements, empty = 1, 0, true
    i = i + 1
    while i <= n do
        local c = str_byte(body, i)
        if c == QUOTE then
            if depth == 1 then
                empty = false
            end
            i = string_end(body, i, n)
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
                elseif not (c == 32 or c == 10 or c == 13 or c == 9) then
                    empty = false
                end
            end
            i = i + 1
        end
    end
    return nil
end

-- The position after the scalar (number, true, false, null) that starts at i.
local function scalar_end(body, i, n)
    while i <= n do
        local c = str_byte(body, i)
        if c == COMMA or c == RBRACE or c == RBRACKET or c == 32 or c == 10 or c == 13 or c == 9 then
            break
        end
        i = i + 1
    end
    return i
end

-- A wanted member's scalar value (body[i .. j - 1]), as tonumber(cjson's value) gives it:
-- a number or nil; false: the body is cjson's to read (a number token Lua may read otherwise).
local function number_of(body, i, j)
    local tok = str_sub(body, i, j - 1)
    if tok == "null" or tok == "true" or tok == "false" then
        return nil
    end
    if str_find(tok, "^%-?%d+%.?%d*[eE]?[%+%-]?%d*$") then   -- a plain JSON number (strtod and tonumber agree)
        local v = tonumber(tok)
        return v
    end
    return false
end

-- Which wanted member the name at body[i .. i + len) is: 1 max_tokens, 2 max_completion_tokens,
-- 3 max_output_tokens, 4 n, 5 prompt; 0 none (lengths first: no string is made).
local NAMES = { "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "prompt" }
local BY_LEN = {}
for k, name in ipairs(NAMES) do
    BY_LEN[#name] = k
end

local function wanted(body, i, len)
    local k = BY_LEN[len]
    if k and str_sub(body, i, i + len - 1) == NAMES[k] then
        return k
    end
    return 0
end

function _M.read(body)
    local n = #body
    next_bs = 0
    local i, c = skip_space(body, 1)
    if c ~= LBRACE then
        return nil
    end
    local v1, v2, v3, v4, prompts = nil, nil, nil, nil, 0
    i, c = skip_space(body, i + 1)
    if c == RBRACE then
        i = i + 1
    else
        while true do
            if c ~= QUOTE then
                return nil
            end
            local name_end, escaped = string_end(body, i, n)
            if not name_end or escaped then
                return nil
            end
            local k = wanted(body, i + 1, name_end - i - 2)
            i, c = skip_space(body, name_end)
            if c ~= COLON then
                return nil
            end
            i, c = skip_space(body, i + 1)
            if not c then
                return nil
            end
            local j, count
            if c == QUOTE then
                j, escaped = string_end(body, i, n)
            elseif c == LBRACE or c == LBRACKET then
                j, count = container_end(body, i, n)
            else
                j = scalar_end(body, i, n)
            end
            if not j or j == i then
                return nil
            end
            if k == 5 then
                -- #prompt counts when it is an array whose first element is not a number
                local _, first
                if c == LBRACKET then
                    _, first = skip_space(body, i + 1)
                end
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
                local v
                if c == QUOTE then   -- a string: tonumber of its text, unless it holds an escape
                    if escaped then
                        return nil
                    end
                    v = tonumber(str_sub(body, i + 1, j - 2))
                elseif c ~= LBRACE and c ~= LBRACKET then
                    v = number_of(body, i, j)
                    if v == false then
                        return nil
                    end
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
            i, c = skip_space(body, j)
            if c == RBRACE then
                i = i + 1
                break
            end
            if c ~= COMMA then
                return nil
            end
            i, c = skip_space(body, i + 1)
        end
    end
    if skip_space(body, i) ~= n + 1 then
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
