-- The entries of nginx's L1 (plugins/l1/cache.lua): how a kept answer is written (its
-- template: the engine's replay with its response id and `created` cut out, tagged) and
-- read back (parsed once per worker), and the fresh id and time each replay puts in, as the
-- engine does (engine/zccp/cache/answer.py, flow._replay).
local ffi = require "ffi"
local bit = require "bit"
local sha256 = require "zccp.lib.sha256"

local ffi_string = ffi.string
local bxor = bit.bxor
local rol = bit.rol
local tohex = bit.tohex
local str_find = string.find
local str_sub = string.sub
local str_gsub = string.gsub
local str_match = string.match
local str_byte = string.byte
local str_reverse = string.reverse
local concat = table.concat
local tonumber = tonumber
local pairs = pairs
local load = load
local assert = assert

local _M = {}

-- "\1" and "\2": the id's and `created`'s placeholders in a kept answer (JSON and SSE
-- never hold raw control bytes).

-- Per API: the response id's prefix and random length (engine/zccp/api/*.new_response_id),
-- where the id stands in an answer, and whether it has a `created` field.
local APIS = {
    anthropic = { prefix = "msg_", n = 24, find = '"id":"(msg_%w+)"', created = false },
    openai = { prefix = "chatcmpl-", n = 29, find = '"id":"(chatcmpl%-%w+)"', created = true },
}

local B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
local B62_OF = ffi.new("uint8_t[256]")   -- byte -> base62 character, as common._B62_TABLE (b % 62)
for b = 0, 255 do
    B62_OF[b] = str_byte(B62, b % 62 + 1)
end
local POOL_N = 4096
local POOL = ffi.new("uint8_t[?]", POOL_N)   -- random bytes for the ids (fresh_id)
local OUT = ffi.new("uint8_t[64]")
local HEX = {}   -- byte -> two hex digits
for b = 0, 255 do
    HEX[b] = string.format("%02x", b)
end

-- One id's base62 characters from the random pool at `at`, unrolled per API at load (a
-- loop of 24 or 29 turns is where LuaJIT's trace through serve() gave up).
local function make_fill(n)
    local src = { "local OUT, B62_OF, POOL = ...\nreturn function(at)\n" }
    for i = 0, n - 1 do
        src[#src + 1] = (" OUT[%d] = B62_OF[POOL[at + %d]]\n"):format(i, i)
    end
    src[#src + 1] = "end\n"
    return assert(load(concat(src), "=zccp.plugins.l1.entry.fill" .. n))(OUT, B62_OF, POOL)
end
for _, a in pairs(APIS) do
    a.fill = make_fill(a.n)
    a.id_len = #a.prefix + a.n
end

-- A fresh response id: RAND_bytes drawn POOL_N bytes at a time (one libcrypto call per
-- ~150 ids, not one per id). The pool is filled in the worker, at its first id: never
-- copied from the master into several workers.
local pool_at = POOL_N

local function fresh_id(a)
    local n = a.n
    if pool_at + n > POOL_N then
        if not sha256.random_into(POOL, POOL_N) then
            return nil
        end
        pool_at = 0
    end
    a.fill(pool_at)
    pool_at = pool_at + n
    return a.prefix .. ffi_string(OUT, n)
end

-- The context id (16 hex digits of the first 8 bytes of the digest), unrolled.
local function hex8(d)
    local b1, b2, b3, b4, b5, b6, b7, b8 = str_byte(d, 1, 8)
    return HEX[b1] .. HEX[b2] .. HEX[b3] .. HEX[b4] .. HEX[b5] .. HEX[b6] .. HEX[b7] .. HEX[b8]
end

-- A kept entry, parsed: { sse, born, pin, pout, parts, ids, crs, fixed } (parts: the
-- template's literal pieces with a slot at each placeholder; ids, crs: those slots'
-- indexes; fixed: the literal pieces' length), or nil when it is not one keep() wrote.
-- entry: a tag (TAG_LEN hex digits, see tag_of), "S" (SSE) or "J", the time the answer
-- was born (Age), the engine's input and output token counts (what a hit saves, metered
-- by zccp.plugins.limits.admit), ":", the template
local TAG_LEN = 8

local function parse(v)
    local colon = str_find(v, ":", TAG_LEN + 2, true)
    local b, pin, pout = str_match(str_sub(v, TAG_LEN + 2, colon and colon - 1 or 1), "^(%d+),(%d+),(%d+)$")
    local born = tonumber(b)
    if not born then
        return nil
    end
    local parts, ids, crs, fixed = {}, {}, {}, 0
    local pos, len = colon + 1, #v
    while pos <= len + 1 do
        local at = str_find(v, "[\1\2]", pos)
        local piece = str_sub(v, pos, (at or len + 1) - 1)
        parts[#parts + 1] = piece
        fixed = fixed + #piece
        if not at then
            break
        end
        parts[#parts + 1] = false
        local slots = str_byte(v, at) == 1 and ids or crs
        slots[#slots + 1] = #parts
        pos = at + 1
    end
    if #ids == 0 then   -- keep() kept only answers with an id
        return nil
    end
    return { sse = str_byte(v, TAG_LEN + 1) == 83, born = born, pin = pin, pout = pout, parts = parts,   -- 83: "S"
             ids = ids, crs = crs, fixed = fixed }
end

-- The entries this worker has parsed, by their bytes (the dict's value: the same bytes
-- are the same entry), so that a hit parses nothing; emptied whole once it holds
-- PARSED_MAX_BYTES of entries.
local PARSED_MAX_BYTES = 8 * 1024 * 1024
local parsed, parsed_bytes = {}, 0

local function entry_of(v)
    local e = parsed[v]
    if e then
        return e
    end
    e = parse(v)
    if e then
        if parsed_bytes + #v > PARSED_MAX_BYTES then
            parsed, parsed_bytes = {}, 0
        end
        parsed[v], parsed_bytes = e, parsed_bytes + #v
    end
    return e
end

-- The answer with its id (everywhere it occurs as the response's id) and `created`
-- replaced by the placeholders, or nil when it does not look like the engine's replay.
local function template(a, body)
    if str_find(body, "[\1\2]") then
        return nil
    end
    local id = str_match(body, a.find)
    if not id then
        return nil
    end
    local n
    body, n = str_gsub(body, '"id":"' .. str_gsub(id, "%-", "%%-") .. '"', '"id":"\1"')
    if n == 0 then
        return nil
    end
    if a.created then
        local c = str_match(body, '"created":(%d+)')
        if not c then
            return nil
        end
        body = str_gsub(body, '"created":' .. c .. '([,}])', '"created":\2%1')
    end
    return body
end

-- An entry's first bytes, from its born time and counts. LuaJIT hashes a long string from
-- a few of its bytes, the first among them: entries that differ only in those numbers
-- (one answer to many prompts) shared one hash chain, walked by every hit's string and its
-- lookup in the parsed entries, slower the more such entries there are (bench/string_hash.lua
-- measures it). A tag of those numbers first spreads them; identical entries stay one string.
local function tag_of(born, pin, pout)
    local tag = str_reverse(tohex(bxor(born, rol(pin, 11), rol(pout, 21))))   -- low digits first
    return tag
end


_M.APIS, _M.fresh_id, _M.hex8, _M.entry_of, _M.template, _M.tag_of = APIS, fresh_id, hex8, entry_of, template, tag_of
return _M
