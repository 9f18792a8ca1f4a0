-- The canonical form the exact and prefix keys hash (docs/fingerprint.md §6): a decoded,
-- masked request written as canonical JSON bytes into a string.buffer, with the place
-- of the final message. engine/zccp/cache/fp/canonical.py is the same rule in Python,
-- byte for byte.
--
--   local canonical = require "zccp.fp.canonical"
--   local cut, first, stop, inexact = canonical.write(buf, api, doc)   -- buf: a string.buffer (reset first)
--   -- buf holds CJ(top); when `messages` is a non-empty array, its final element is
--   -- buf[first, stop) and buf[cut, stop) is that element with the comma before it
--   -- (CJ of top without the final message is buf without [cut, stop)); else nil.
--   -- inexact: the doc holds a number of magnitude >= 2^53 (cjson decoded it to a double:
--   -- an integer's digits may be lost, so the keys are the engine's to compute, §6).
--   local spans, n = canonical.route_spans()   -- after write(): the route key's bytes
--   -- (zccp.fp.fingerprint r.route_key; not part of docs/fingerprint.md, nginx only): offset,
--   -- length pairs into buf of the values of model, system and tools, and of `messages`
--   -- from its first element through its first "user" message (all of them without one),
--   -- every "cache_control" member in them left out.
local ffi = require "ffi"
local bit = require "bit"
local T = require "zccp.fp.tables"
local null = require("cjson").null

local type = type
local next = next
local ipairs = ipairs
local error = error
local tonumber = tonumber
local sort = table.sort
local str_format = string.format
local ffi_new = ffi.new
local ffi_cast = ffi.cast
local band, bxor = bit.band, bit.bxor

local _M = { _VERSION = "0.1.0" }

local EXCLUDED = {}
for _, k in ipairs(T.excluded_keys) do
    EXCLUDED[k] = true
end

local u8p = ffi.typeof("const uint8_t *")

-- Numbers: glibc's snprintf (not LuaJIT's own formatter, which rounds ties differently
-- from C and Python), shortest of %.15g/%.16g/%.17g that reads back as the same double.
ffi.cdef [[ int snprintf(char *str, size_t size, const char *format, ...); ]]
local C = ffi.C
local numbuf = ffi_new("char[64]")
local ffi_string = ffi.string
local FMT = { "%.15g", "%.16g", "%.17g" }
local TWO53 = 2 ^ 53
local inexact = false   -- set by num(), reset by write()

local function num(v)
    if v ~= v then
        return "nan"
    end
    if v >= TWO53 or v <= -TWO53 then
        inexact = true   -- maybe an integer whose digits cjson rounded (infinities too)
    end
    if v == 0 then
        return "0"
    end
    if v == 1 / 0 then
        return "inf"
    end
    if v == -1 / 0 then
        return "-inf"
    end
    -- an integer below 10^15 in magnitude: %.15g writes all its digits, as %d does
    if v % 1 == 0 and v < 1e15 and v > -1e15 then
        local s = str_format("%d", v)
        return s
    end
    local s
    for i = 1, 3 do
        local n = C.snprintf(numbuf, 64, FMT[i], v)
        s = ffi_string(numbuf, n)
        if tonumber(s) == v then
            return s
        end
    end
    return s
end
_M.number = num

-- Strings: `"`, `\` and bytes 0x00-0x1F are escaped, every other byte is copied.
local ESC = {}
for c = 0, 255 do
    ESC[c] = false
end
ESC[34], ESC[92] = '\\"', '\\\\'
local SPECIAL = ffi_new("uint8_t[256]")
SPECIAL[34], SPECIAL[92] = 1, 1
for c = 0, 31 do
    ESC[c] = str_format("\\u%04x", c)
    SPECIAL[c] = 1
end

local u64p = ffi.typeof("const uint64_t *")
local K01 = 0x0101010101010101ULL
local K80 = 0x8080808080808080ULL
local K20 = 0x2020202020202020ULL
local K22 = 0x2222222222222222ULL
local K5C = 0x5C5C5C5C5C5C5C5CULL
local bnot, bor = bit.bnot, bit.bor

-- Index of the first byte of p[i .. n-1] that needs escaping, or n. Eight bytes at a
-- time (a byte < 0x20, == 0x22 or == 0x5C in the word makes the test non-zero), then
-- byte by byte: the byte loop alone decides, the word test only skips clean words.
local function first_special(p, i, n)
    while i + 8 <= n do
        local v = ffi_cast(u64p, p + i)[0]
        local q = bxor(v, K22)
        local b = bxor(v, K5C)
        if band(bor(band(v - K20, bnot(v)), band(q - K01, bnot(q)), band(b - K01, bnot(b))), K80) ~= 0ULL then
            break
        end
        i = i + 8
    end
    while i < n do
        if SPECIAL[p[i]] ~= 0 then
            return i
        end
        i = i + 1
    end
    return n
end

local function put_str(buf, s)
    local n = #s
    local p = ffi_cast(u8p, s)
    local j = first_special(p, 0, n)
    if j == n then
        buf:put('"', s, '"')
        return
    end
    buf:put('"')
    local i = 0
    repeat
        if j > i then
            buf:putcdata(p + i, j - i)
        end
        buf:put(ESC[p[j]])
        i = j + 1
        j = first_special(p, i, n)
    until j == n
    if n > i then
        buf:putcdata(p + i, n - i)
    end
    buf:put('"')
end

local cj

-- While a member the route key hashes is written (`routing`), the bytes of every
-- "cache_control" member (with its comma) are noted as a hole the route key skips:
-- Anthropic's recommended breakpoint moves to the last block every turn, and the
-- conversation must keep its replica (docs/engines.md).
local routing = false
local HOLES, nholes = {}, 0

local function hole(from, to)
    while nholes > 0 and HOLES[nholes - 1] >= from do   -- a hole inside this one
        nholes = nholes - 2
    end
    HOLES[nholes + 1], HOLES[nholes + 2] = from, to
    nholes = nholes + 2
end

-- An object: members sorted by key bytes, each value written by put_value(buf, key, value).
local function put_object(buf, t, put_value)
    local keys, nk = {}, 0
    for k in next, t do
        nk = nk + 1
        keys[nk] = k
    end
    if nk == 0 then
        buf:put("[]")   -- cjson decodes {} and [] alike
        return
    end
    sort(keys)
    buf:put("{")
    local pending   -- a first-member cache_control's start: its hole takes the next comma
    for i = 1, nk do
        local k = keys[i]
        local from = #buf
        if i > 1 then
            buf:put(",")
            if pending then
                hole(pending, #buf)
                pending = nil
            end
        end
        put_str(buf, k)
        buf:put(":")
        put_value(buf, k, t[k])
        if routing and k == "cache_control" then
            if i > 1 or nk == 1 then
                hole(from, #buf)
            else
                pending = from
            end
        end
    end
    buf:put("}")
end

local function cj_member(buf, _, v)
    cj(buf, v)
end

local function cj_table(buf, t)
    if t[1] ~= nil then
        buf:put("[")
        for i = 1, #t do
            if i > 1 then
                buf:put(",")
            end
            cj(buf, t[i])
        end
        buf:put("]")
        return
    end
    put_object(buf, t, cj_member)
end

cj = function(buf, v)
    local tv = type(v)
    if tv == "string" then
        put_str(buf, v)
    elseif tv == "number" then
        buf:put(num(v))
    elseif tv == "boolean" then
        buf:put(v and "true" or "false")
    elseif tv == "table" then
        cj_table(buf, v)
    elseif v == null then
        buf:put("null")
    else
        error("zccp.fp.canonical: unexpected value of type " .. tv)
    end
end

-- The top-level object's members: as cj_member, except that the place of the final
-- message is noted in cut, first, stop (see the top of this file), and the route key's
-- spans in SPANS (route_spans).
local cut, first, stop
local SPANS, nspans = {}, 0
local ROUTED = { model = true, system = true, tools = true }

local function span(from, to)
    SPANS[nspans + 1], SPANS[nspans + 2] = from, to - from
    nspans = nspans + 2
end

local function is_user(m)
    return type(m) == "table" and m.role == "user"
end

local function top_member(buf, k, v)
    if k ~= "messages" or type(v) ~= "table" or v[1] == nil then
        local from = #buf
        routing = ROUTED[k] == true
        cj(buf, v)
        routing = false
        if ROUTED[k] then
            span(from, #buf)
        end
        return
    end
    routing = true
    local n = #v
    buf:put("[")
    local head, head_end = #buf, nil
    for j = 1, n - 1 do
        cj(buf, v[j])
        if not head_end and is_user(v[j]) then
            head_end = #buf
        end
        buf:put(",")
    end
    cut = #buf - (n > 1 and 1 or 0)
    first = #buf
    cj(buf, v[n])
    stop = #buf
    routing = false
    span(head, head_end or stop)
    buf:put("]")
end

-- The routed ranges without their holes (both in buffer order).
local ROUTE = {}

function _M.route_spans()
    local n, h = 0, 1
    for i = 1, nspans, 2 do
        local a, b = SPANS[i], SPANS[i] + SPANS[i + 1]
        while h < nholes and HOLES[h] < b do
            local ha, hb = HOLES[h], HOLES[h + 1]
            if hb > a then
                if ha > a then
                    ROUTE[n + 1], ROUTE[n + 2] = a, ha - a
                    n = n + 2
                end
                a = hb
            end
            h = h + 2
        end
        if b > a then
            ROUTE[n + 1], ROUTE[n + 2] = a, b - a
            n = n + 2
        end
    end
    return ROUTE, n
end

-- Writes CJ(top) of `doc` (decoded, masked) into buf (reset first); returns the place
-- of the final message (cut, first, stop: 0-based offsets into buf, or nil), and whether
-- a number of magnitude >= 2^53 was written (then the keys must not be used).
function _M.write(buf, api, doc)
    local top = {}
    for k, v in next, doc do
        if v ~= null and not EXCLUDED[k] then
            top[k] = v
        end
    end
    if api == "openai" and top.max_completion_tokens ~= nil then
        top.max_tokens = top.max_completion_tokens
        top.max_completion_tokens = nil
    end
    buf:reset()
    cut, first, stop, inexact, nspans, nholes, routing = nil, nil, nil, false, 0, 0, false
    put_object(buf, top, top_member)
    return cut, first, stop, inexact
end

return _M
