-- Fingerprints and cache keys (docs/fingerprint.md; engine/zccp/fingerprint.py is
-- the same algorithm in Python, checked byte for byte by the golden vectors and the
-- identity test).
--
--   local fp = require "zccp.fingerprint"
--   local r, err = fp.compute("anthropic" | "openai", body)
--   r.csf_key    uint64_t cdata   FNV-1a 64 over the 128 MinHash values
--   r.bands      { 16 x uint64_t cdata }   LSH band keys (16 bands x 8 rows)
--   r.exact_key  32-byte string   SHA-256 of the canonical masked request
--   r.signature  uint32_t[128] cdata   the MinHash signature
--   r.tokens     prompt tokens the CSF saw (<= 1024)
--   r.complete   true when the CSF saw the whole prompt
--   r.masked     true when a mask pattern changed some text
--
-- Bounded work: bodies above decode_limit (64 KiB) are not decoded here
-- (nil, "body too large to fingerprint": the engine computes the same fingerprint),
-- and tokenizing stops at the 1025th token.
local ffi = require "ffi"
local bit = require "bit"
local T = require "zccp.fp_tables"

local type = type
local pcall = pcall
local error = error
local next = next
local tostring = tostring
local pairs = pairs
local ipairs = ipairs
local tonumber = tonumber
local require = require
local str_byte = string.byte
local str_char = string.char
local str_format = string.format
local str_gsub = string.gsub
local str_lower = string.lower
local str_find = string.find
local concat = table.concat
local sort = table.sort
local ffi_new = ffi.new
local ffi_cast = ffi.cast
local band, bxor, lshift, rshift, tobit = bit.band, bit.bxor, bit.lshift, bit.rshift, bit.tobit

local ok_clear, table_clear = pcall(require, "table.clear")
if not ok_clear then
    table_clear = function(t)
        for k in pairs(t) do
            t[k] = nil
        end
    end
end

local _M = { _VERSION = "0.1.0" }

local MAX_TOKENS = T.max_tokens
local NUM_PERM = T.num_perm
local BANDS = T.bands
local ROWS = T.rows
local DECODE_LIMIT = T.decode_limit
local MAX_DEPTH = 128
local EXACT_PREFIX = "zccp-exact/1\n"
local EXCLUDED = { stream = true, stream_options = true, metadata = true, user = true }

_M.DECODE_LIMIT = DECODE_LIMIT
_M.MAX_TOKENS = MAX_TOKENS

local u64 = ffi.typeof("uint64_t")
local u64_arr = ffi.typeof("uint64_t[?]")
local u32_arr = ffi.typeof("uint32_t[?]")
local P61 = 0x1FFFFFFFFFFFFFFFULL
local M32 = 0xFFFFFFFFULL
local FNV64_OFFSET = 0xCBF29CE484222325ULL
local FNV64_PRIME = 0x100000001B3ULL

-- ------------------------------------------------------------------ MinHash parameters

local A_HI = u64_arr(NUM_PERM)   -- a_i >> 32   (< 2^29)
local A_LO = u64_arr(NUM_PERM)   -- a_i & 0xffffffff
local B = u64_arr(NUM_PERM)

do
    local state = u64(T.seed_hi) * 0x100000000ULL + u64(T.seed_lo)
    local function splitmix64()
        state = state + 0x9E3779B97F4A7C15ULL
        local z = state
        z = bxor(z, rshift(z, 30)) * 0xBF58476D1CE4E5B9ULL
        z = bxor(z, rshift(z, 27)) * 0x94D049BB133111EBULL
        return bxor(z, rshift(z, 31))
    end
    for i = 0, NUM_PERM - 1 do
        local a = 0ULL
        while a == 0ULL do
            a = splitmix64() % P61
        end
        A_HI[i] = rshift(a, 32)
        A_LO[i] = band(a, M32)
        B[i] = splitmix64() % P61
    end
end

-- ------------------------------------------------------------------ code point classes

local R_LO, R_HI, R_CL, NR = {}, {}, {}, 0
for _, r in ipairs(T.ranges) do
    NR = NR + 1
    R_LO[NR], R_HI[NR] = r[1], r[2]
    if r[3] == "S" then
        R_CL[NR] = 1
    elseif r[3] == "C" then
        R_CL[NR] = 2
    else
        error("zccp.fp_tables: unknown class " .. tostring(r[3]))
    end
end

-- 0: word, 1: separator, 2: CJK (a token of its own)
local function cp_class(cp)
    local lo, hi = 1, NR
    while lo <= hi do
        local mid = rshift(lo + hi, 1)
        if cp < R_LO[mid] then
            hi = mid - 1
        elseif cp > R_HI[mid] then
            lo = mid + 1
        else
            return R_CL[mid]
        end
    end
    return 0
end

-- ASCII: 1 for [0-9a-z] (the text is lowercased first), else 0 (separator)
local ASCII_WORD = ffi_new("uint8_t[128]")
for c = 48, 57 do ASCII_WORD[c] = 1 end
for c = 97, 122 do ASCII_WORD[c] = 1 end

-- ------------------------------------------------------------------ CSF

local TS, TE = {}, {}            -- token byte ranges [TS, TE) (0-based) in the lowercased text
local X = u64_arr(MAX_TOKENS + 1) -- distinct shingle hashes
local SEEN = {}
local SIG = u64_arr(NUM_PERM)
local u8p = ffi.typeof("const uint8_t *")

-- Tokenizes `s` (already lowercased); returns the number of tokens kept and whether
-- that was all of them. Token k is s[TS[k] .. TE[k]-1].
local function tokenize(p, n)
    local ntok = 0
    local ws = -1       -- start of the current word, -1 when none
    local i = 0
    local limit = MAX_TOKENS
    while i < n do
        local c = p[i]
        if c < 0x80 then
            if ASCII_WORD[c] == 1 then
                if ws < 0 then
                    if ntok == limit then
                        return ntok, false
                    end
                    ws = i
                end
            elseif ws >= 0 then
                ntok = ntok + 1
                TS[ntok], TE[ntok] = ws, i
                ws = -1
            end
            i = i + 1
        else
            -- decode one well-formed UTF-8 sequence (Unicode Table 3-7), else 1 invalid byte
            local len, cp = 1, -1
            if c >= 0xC2 and c <= 0xDF then
                if i + 1 < n then
                    local c1 = p[i + 1]
                    if c1 >= 0x80 and c1 <= 0xBF then
                        len, cp = 2, (c - 0xC0) * 64 + (c1 - 0x80)
                    end
                end
            elseif c >= 0xE0 and c <= 0xEF then
                if i + 2 < n then
                    local c1, c2 = p[i + 1], p[i + 2]
                    local lo1, hi1 = 0x80, 0xBF
                    if c == 0xE0 then lo1 = 0xA0 elseif c == 0xED then hi1 = 0x9F end
                    if c1 >= lo1 and c1 <= hi1 and c2 >= 0x80 and c2 <= 0xBF then
                        len, cp = 3, (c - 0xE0) * 4096 + (c1 - 0x80) * 64 + (c2 - 0x80)
                    end
                end
            elseif c >= 0xF0 and c <= 0xF4 then
                if i + 3 < n then
                    local c1, c2, c3 = p[i + 1], p[i + 2], p[i + 3]
                    local lo1, hi1 = 0x80, 0xBF
                    if c == 0xF0 then lo1 = 0x90 elseif c == 0xF4 then hi1 = 0x8F end
                    if c1 >= lo1 and c1 <= hi1 and c2 >= 0x80 and c2 <= 0xBF and c3 >= 0x80 and c3 <= 0xBF then
                        len, cp = 4, (c - 0xF0) * 262144 + (c1 - 0x80) * 4096 + (c2 - 0x80) * 64 + (c3 - 0x80)
                    end
                end
            end
            local cls = 0
            if cp >= 0 then
                cls = cp_class(cp)
            end
            if cls == 0 then            -- word byte(s); invalid bytes land here too
                if ws < 0 then
                    if ntok == limit then
                        return ntok, false
                    end
                    ws = i
                end
            else
                if ws >= 0 then
                    ntok = ntok + 1
                    TS[ntok], TE[ntok] = ws, i
                    ws = -1
                end
                if cls == 2 then
                    if ntok == limit then
                        return ntok, false
                    end
                    ntok = ntok + 1
                    TS[ntok], TE[ntok] = i, i + len
                end
            end
            i = i + len
        end
    end
    if ws >= 0 then
        ntok = ntok + 1
        TS[ntok], TE[ntok] = ws, n
    end
    return ntok, true
end

-- FNV-1a 32 over p[s .. e-1] continuing from h (signed 32-bit representation)
local function fnv32(p, s, e, h)
    for k = s, e - 1 do
        h = bxor(h, p[k])
        h = tobit(lshift(h, 24) + h * 403)   -- h * 0x01000193 mod 2^32
    end
    return h
end

local FNV32_OFFSET = tobit(0x811C9DC5)

-- Fills X with the distinct shingle hashes; returns their count.
local function shingles(p, ntok)
    table_clear(SEEN)
    local nx = 0
    if ntok == 1 then
        local h = fnv32(p, TS[1], TE[1], FNV32_OFFSET)
        X[0] = h % 4294967296
        return 1
    end
    local prev = fnv32(p, TS[1], TE[1], FNV32_OFFSET)
    for j = 2, ntok do
        local s, e = TS[j], TE[j]
        local cur = fnv32(p, s, e, FNV32_OFFSET)
        local h = bxor(prev, 0x20)
        h = tobit(lshift(h, 24) + h * 403)
        h = fnv32(p, s, e, h)
        local x = h % 4294967296
        if not SEEN[x] then
            SEEN[x] = true
            X[nx] = x
            nx = nx + 1
        end
        prev = cur
    end
    return nx
end

-- SIG[i] = min over X of ((a_i * x + b_i) mod (2^61 - 1)) & 0xffffffff
local function minhash(nx)
    for i = 0, NUM_PERM - 1 do
        local ahi, alo, b = A_HI[i], A_LO[i], B[i]
        local m = M32
        for k = 0, nx - 1 do
            local x = X[k]
            local hi = ahi * x                    -- < 2^61
            local lo = alo * x                    -- < 2^64
            local s = band(lshift(hi, 32), P61) + rshift(hi, 29) + band(lo, P61) + rshift(lo, 61) + b
            local r = band(s, P61) + rshift(s, 61)
            if r >= P61 then
                r = r - P61
            end
            r = band(r, M32)
            if r < m then
                m = r
            end
        end
        SIG[i] = m
    end
end

local function fnv64_u32(h, v)
    for _ = 1, 4 do
        h = bxor(h, band(v, 0xFFULL)) * FNV64_PRIME
        v = rshift(v, 8)
    end
    return h
end

-- Signature of an already-masked prompt text: sig (uint32_t[128]), tokens, complete.
local function csf(text)
    local lower = str_lower(text)
    local p = ffi_cast(u8p, lower)
    local ntok, complete = tokenize(p, #lower)
    local nx = 0
    if ntok > 0 then
        nx = shingles(p, ntok)
    end
    minhash(nx)
    local sig = u32_arr(NUM_PERM)
    for i = 0, NUM_PERM - 1 do
        sig[i] = SIG[i]
    end
    return sig, ntok, complete
end

local function keys_of(sig)
    local bands = {}
    for b = 0, BANDS - 1 do
        local h = bxor(FNV64_OFFSET, u64(b)) * FNV64_PRIME
        for r = 0, ROWS - 1 do
            h = fnv64_u32(h, u64(sig[b * ROWS + r]))
        end
        bands[b + 1] = h
    end
    local h = FNV64_OFFSET
    for i = 0, NUM_PERM - 1 do
        h = fnv64_u32(h, u64(sig[i]))
    end
    return h, bands
end

_M.csf = csf
_M.keys_of = keys_of

-- MinHash of an explicit list of 32-bit shingle hashes (tests: with one value x,
-- signature[i] is h_i(x) itself). Returns a uint32_t[128] cdata.
function _M.minhash_of(xs)
    local nx = #xs
    if nx > MAX_TOKENS + 1 then
        error("zccp.fingerprint.minhash_of: too many values", 2)
    end
    for k = 1, nx do
        X[k - 1] = xs[k]
    end
    minhash(nx)
    local sig = u32_arr(NUM_PERM)
    for i = 0, NUM_PERM - 1 do
        sig[i] = SIG[i]
    end
    return sig
end

-- ------------------------------------------------------------------ JSON

local cjson = require("cjson").new()   -- a private instance: its settings are ours alone
cjson.decode_invalid_numbers(false)
cjson.decode_max_depth(MAX_DEPTH)
local cjson_decode = cjson.decode
local null = cjson.null

local masks -- required lazily (needs ngx.re)

local function mask_text(ctx, s)
    local out, changed_or_err = masks.apply(s)
    if not out then
        ctx.err = changed_or_err
        return s
    end
    if changed_or_err then
        ctx.changed = true
    end
    return out
end

-- Replace, in place, every string that is the value of a `content` or `text` member.
local function mask_walk(ctx, t)
    if t[1] ~= nil then
        for i = 1, #t do
            local v = t[i]
            if type(v) == "table" then
                mask_walk(ctx, v)
            end
        end
    else
        for k, v in next, t do
            local tv = type(v)
            if tv == "string" then
                if k == "content" or k == "text" then
                    t[k] = mask_text(ctx, v)
                end
            elseif tv == "table" then
                mask_walk(ctx, v)
            end
        end
    end
end

-- Numbers: glibc's snprintf (not LuaJIT's own formatter, which rounds ties differently
-- from C and Python), shortest of %.15g/%.16g/%.17g that reads back as the same double.
ffi.cdef [[ int snprintf(char *str, size_t size, const char *format, ...); ]]
local C = ffi.C
local numbuf = ffi_new("char[64]")
local ffi_string = ffi.string
local FMT = { "%.15g", "%.16g", "%.17g" }

local function num(v)
    if v ~= v then
        return "nan"
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
_M.canonical_number = num

local ESC = { ['"'] = '\\"', ['\\'] = '\\\\' }
for c = 0, 31 do
    ESC[str_char(c)] = str_format("\\u%04x", c)
end

local function str(s)
    if str_find(s, '[%z\1-\31"\\]') then
        s = str_gsub(s, '[%z\1-\31"\\]', ESC)
    end
    return '"' .. s .. '"'
end

local cj

local function cj_table(t, out, n)
    if t[1] ~= nil then
        n = n + 1
        out[n] = "["
        for i = 1, #t do
            if i > 1 then
                n = n + 1
                out[n] = ","
            end
            n = cj(t[i], out, n)
        end
        n = n + 1
        out[n] = "]"
        return n
    end
    local keys, nk = {}, 0
    for k in next, t do
        nk = nk + 1
        keys[nk] = k
    end
    if nk == 0 then
        n = n + 1
        out[n] = "[]"   -- cjson decodes {} and [] alike
        return n
    end
    sort(keys)
    n = n + 1
    out[n] = "{"
    for i = 1, nk do
        local k = keys[i]
        n = n + 1
        out[n] = (i > 1 and "," or "") .. str(k) .. ":"
        n = cj(t[k], out, n)
    end
    n = n + 1
    out[n] = "}"
    return n
end

cj = function(v, out, n)
    local tv = type(v)
    n = n + 1
    if tv == "string" then
        out[n] = str(v)
    elseif tv == "number" then
        out[n] = num(v)
    elseif tv == "boolean" then
        out[n] = v and "true" or "false"
    elseif tv == "table" then
        return cj_table(v, out, n - 1)
    elseif v == null then
        out[n] = "null"
    else
        error("zccp.fingerprint: unexpected value of type " .. tv)
    end
    return n
end

local function canonical(api, doc)
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
    local out = { EXACT_PREFIX, api, "\n" }
    local n = cj(top, out, 3)
    return concat(out, "", 1, n)
end

-- ------------------------------------------------------------------ prompt text

local function text_of(content)
    local tc = type(content)
    if tc == "string" then
        return content
    end
    if content == nil or content == null then
        return ""
    end
    if tc ~= "table" then
        return "[?]"
    end
    if content[1] == nil and next(content) ~= nil then
        return "[?]"   -- an object, not an array
    end
    local parts = {}
    for i = 1, #content do
        local blk = content[i]
        local t = type(blk) == "table" and blk[1] == nil and blk.type or nil
        if type(t) == "string" then
            local txt = blk.text
            if t == "text" and type(txt) == "string" then
                parts[i] = txt
            else
                parts[i] = "[" .. t .. "]"
            end
        else
            parts[i] = "[?]"
        end
    end
    return concat(parts, "\n")
end

local function entry(role, content)
    if type(role) ~= "string" then
        role = "?"
    end
    return role .. ": " .. text_of(content) .. "\n"
end

local function prompt_text(api, doc)
    local out, n = {}, 0
    local msgs = doc.messages
    if type(msgs) ~= "table" or (msgs[1] == nil and next(msgs) ~= nil) then
        msgs = {}
    end
    if api == "anthropic" then
        local system = doc.system
        if system ~= nil and system ~= null then
            n = n + 1
            out[n] = entry("system", system)
        end
        for i = 1, #msgs do
            local m = msgs[i]
            n = n + 1
            if type(m) == "table" and m[1] == nil then
                out[n] = entry(m.role, m.content)
            else
                out[n] = entry(nil, "[?]")
            end
        end
    else
        local rest, nr = {}, 0
        for i = 1, #msgs do
            local m = msgs[i]
            if type(m) == "table" and m[1] == nil then
                local role = m.role
                if role == "system" or role == "developer" then
                    n = n + 1
                    out[n] = entry(role, m.content)
                else
                    nr = nr + 1
                    rest[nr] = entry(role, m.content)
                end
            else
                nr = nr + 1
                rest[nr] = entry(nil, "[?]")
            end
        end
        for i = 1, nr do
            n = n + 1
            out[n] = rest[i]
        end
    end
    return concat(out, "", 1, n)
end

-- ------------------------------------------------------------------ compute

local sha256 = require "zccp.sha256"

-- debug: also return r.canonical and r.prompt; limit: overrides the decode limit
-- (tests; the engine covers larger bodies).
function _M.compute(api, body, debug, limit)
    if api ~= "anthropic" and api ~= "openai" then
        error("zccp.fingerprint.compute: api must be \"anthropic\" or \"openai\"", 2)
    end
    if type(body) ~= "string" then
        error("zccp.fingerprint.compute: body must be a string", 2)
    end
    if #body > (limit or DECODE_LIMIT) then
        return nil, "body too large to fingerprint"
    end
    local first = str_find(body, "[^ \t\r\n]")
    if not first or str_byte(body, first) ~= 123 then   -- '{'
        return nil, "body is not a JSON object"
    end
    local ok, doc = pcall(cjson_decode, body)
    if not ok then
        return nil, "invalid JSON: " .. tostring(doc)
    end
    if type(doc) ~= "table" then
        return nil, "body is not a JSON object"
    end

    if not masks then
        masks = require "zccp.masks"
    end
    local ctx = { changed = false, err = nil }
    local system = doc.system
    if type(system) == "string" then
        doc.system = mask_text(ctx, system)
    elseif type(system) == "table" then
        mask_walk(ctx, system)
    end
    if type(doc.messages) == "table" then
        mask_walk(ctx, doc.messages)
    end
    if ctx.err then
        return nil, ctx.err
    end

    local canon = canonical(api, doc)
    local exact, err = sha256.digest(canon, #canon)
    if not exact then
        return nil, err
    end
    local prompt = prompt_text(api, doc)
    local sig, ntok, complete = csf(prompt)
    local csf_key, bands = keys_of(sig)
    local r = {
        csf_key = csf_key,
        bands = bands,
        exact_key = exact,
        signature = sig,
        tokens = ntok,
        complete = complete,
        masked = ctx.changed,
    }
    if debug then
        r.canonical = canon
        r.prompt = prompt
    end
    return r
end

-- 16 hex digits of a uint64_t cdata (for logs and tests)
function _M.hex64(v)
    return str_format("%08x%08x", tonumber(rshift(v, 32)), tonumber(band(v, M32)))
end

return _M
