-- nginx's L1 cache (docs/cache.md, "L1 in nginx"): the answers the engine replayed as an
-- exact HIT and marked keepable (meta.cache_ttl_s > 0, meta.cache_scope) live in a
-- lua_shared_dict, so that the next identical request is answered here, in the handler
-- that computed its key: no slot, no doorbell, no engine, no Redis. Redis stays the L2.
-- An answer is kept under the digest of the request's raw bytes (found before any
-- fingerprint) and, for a request nginx fingerprinted and did not mask, its exact key.
--
--   local l1 = require "zccp.l1"
--   local k = l1.begin(api, body, flags)             -- nil: this request skips L1
--   if k and l1.serve(api, k) then return end        -- the very same bytes: answered, no fingerprint
--   ... fp = fingerprint.keys(api, body) ...
--   l1.exact(k, fp, tenant)                           -- the same request, other bytes
--   if l1.serve(api, k, true) then return end         -- (true: the last try, a miss is counted)
--   state.keep = k and l1.max_entry(k)                -- relay: keep an SSE answer's bytes
--   l1.keep(api, k, meta, r)                          -- after a complete answer (relay record r)
--   l1.purge()                                        -- every worker's L1 (one shared dict)
--
-- What is kept is the engine's own replay with its response id and `created` cut out;
-- each replay puts in a fresh id (same prefix, length and alphabet as the engine's
-- random_id) and the current time, as the engine does (engine/zccp/cache/answer.py,
-- flow._replay). Only exact HIT replays are kept, never a model's answer: a replay's
-- bytes are what the engine would send again, a model's carry per-run numbers
-- (usage's cached prompt tokens).
local ffi = require "ffi"
local bit = require "bit"
local abi = require "zccp.abi"
local settings = require "zccp.settings"
local sha256 = require "zccp.sha256"
local metrics = require "zccp.metrics"
local limits = require "zccp.limits"
local tenant_mod = require "zccp.tenant"
local arena_mod = require "zccp.arena"

local ngx = ngx
local ngx_shared = ngx.shared
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_time = ngx.time
local ngx_log = ngx.log
local ngx_WARN = ngx.WARN
local ffi_string = ffi.string
local band = bit.band
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
local tostring = tostring
local pairs = pairs
local load = load
local assert = assert

local _M = { _VERSION = "0.1.0" }

local SEP = "\0"
-- "\1" and "\2": the id's and `created`'s placeholders in a kept answer (JSON and SSE
-- never hold raw control bytes)
-- Kept in the slots' dict (settings.dict), which does not evict: the purge epoch (part of
-- every key, so an answer relayed across a purge is never found again), the approximate
-- entry count, and the once-a-second recount lock.
local EPOCH, COUNT, RECOUNT = "l1:epoch", "l1:count", "l1:recount"
local SHARED_EPOCH = "l1:purge_epoch"   -- the cache's purge epoch this nginx's L1 was last emptied for

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

-- The cache.l1 settings and the dict, or nil when L1 is off.
local function config()
    local l1 = settings.get().l1
    if not l1 or not l1.enabled then
        return nil
    end
    local d = ngx_shared[l1.dict]
    return d and l1, d
end

local function meta_dict()
    return ngx_shared[settings.get().dict]
end

-- The keys of one request (k.keys: shared, own, the next pair after it), from `base`:
-- under the shared one when the engine says meta.cache_scope 0 (every tenant's), else
-- under the tenant's (`tenant`: a digest, or nil for anonymous).
local function add_keys(k, base, tenant)
    base = k.epoch .. base .. SEP
    local keys = k.keys
    keys[#keys + 1] = base .. "S"
    keys[#keys + 1] = base .. "T" .. (tenant or "anon")
    return k
end

-- A request's L1 record, or nil when it must not use L1: Cache-Control no-cache or
-- no-store (flags), or L1 off. It first holds the keys of the raw bytes: the SHA-256 of
-- `body` (also the slot's, on a miss), or, when body is nil (it streams into the slot,
-- zccp.body), `pending` until digested() gives it the slot's. Their tenant is the one
-- known without the body (the headers'): identical bytes name the same end user.
-- The cache's purge epoch (zccp.arena.purge_epoch), as a string, or nil (unknown: no L1).
-- Keys carry the value read when the request began: an entry stored under it is never
-- reached once a purge on any host has replaced it. The first request to see a new one
-- empties this L1 (the entries nothing can reach any more would only take room).
local last_e, last_s   -- the epoch last read and its string (tostring of a cdata: not compiled)

local function purge_epoch()
    local e = arena_mod.purge_epoch()
    if not e then
        return nil
    end
    if e == last_e then
        e = last_s
    else
        last_e, last_s = e, tostring(e)
        e = last_s
    end
    local md = meta_dict()
    if md:get(SHARED_EPOCH) ~= e then
        _M.purge()
        md:set(SHARED_EPOCH, e)
    end
    return e
end

-- The keys' common start (L1's epoch, the purge epoch, the API), made again only when
-- an epoch changes.
local PREFIX = {}   -- api -> { l1 epoch, purge epoch, the prefix }
-- The entries' format (parse): a new one is never looked up under an old one's keys.
local FORMAT = "f2" .. SEP

local function prefix(api, n, purged)
    local p = PREFIX[api]
    if p and p[1] == n and p[2] == purged then
        return p[3]
    end
    local s = FORMAT .. tostring(n) .. SEP .. purged .. SEP .. api
    PREFIX[api] = { n, purged, s }
    return s
end

function _M.begin(api, body, flags)
    local cfg, d = config()
    if not cfg then
        return nil
    end
    local C = abi.C
    -- SAMPLED_OFF: a request that wants a fresh sample (L1 cannot tell a sampled request:
    -- it may hold the answers of cache.sampled "on", docs/cache.md)
    if band(flags, C.ZCCP_FLAG_NO_CACHE + C.ZCCP_FLAG_NO_STORE + C.ZCCP_FLAG_SAMPLED_OFF) ~= 0 then
        return nil
    end
    local purged = purge_epoch()
    if not purged then
        return nil
    end
    local tenant = tenant_mod.digest(nil)
    local k = { dict = d, cfg = cfg, keys = {}, tried = 0, raw_tenant = tenant,
                epoch = prefix(api, meta_dict():get(EPOCH) or 0, purged) }
    if not body then
        k.pending = true
        return k
    end
    local digest = sha256.digest(body, #body)
    if not digest then
        return nil
    end
    k.digest = digest
    return add_keys(k, "R" .. digest, tenant)
end

-- A streamed body's keys, from the SHA-256 of its bytes in the slot (32-byte string).
function _M.digested(k, digest)
    k.pending = nil
    k.digest = digest
    return add_keys(k, "R" .. digest, k.raw_tenant)
end

-- Adds the exact keys of a request nginx fingerprinted (fingerprint.keys) and did not
-- mask: its exact key (fingerprint.md §6), and what the exact key leaves out but the answer
-- shows (stream, OpenAI's stream_options.include_usage). Masked requests keep their raw
-- keys only: masked values of other lengths give other prompt token counts (usage).
-- tenant: the request's tenant (zccp.tenant.digest(fp)). True when it added them.
function _M.exact(k, fp, tenant)
    if not fp or fp.masked then
        return false
    end
    add_keys(k, "X" .. (fp.stream and "S" or "J") .. (fp.include_usage and "U" or "-") .. fp.exact_key, tenant)
    return true
end

-- The most bytes of an answer L1 keeps.
function _M.max_entry(k)
    return k.cfg.max_entry
end

-- One id's base62 characters from the random pool at `at`, unrolled per API at load (a
-- loop of 24 or 29 turns is where LuaJIT's trace through serve() gave up).
local function make_fill(n)
    local src = { "local OUT, B62_OF, POOL = ...\nreturn function(at)\n" }
    for i = 0, n - 1 do
        src[#src + 1] = (" OUT[%d] = B62_OF[POOL[at + %d]]\n"):format(i, i)
    end
    src[#src + 1] = "end\n"
    return assert(load(concat(src), "=zccp.l1.fill" .. n))(OUT, B62_OF, POOL)
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
-- by zccp.limits), ":", the template
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

-- Answers the request from L1 when an entry under one of its keys not yet tried is
-- there: true; false on a miss (counted once final: no more keys will come).
function _M.serve(api, k, final)
    local d, keys = k.dict, k.keys
    local i, n = k.tried, #keys
    k.tried = n
    -- the keys not tried yet (two or four), without a loop: a loop left early is where
    -- the trace through serve() was given up
    local v = i < n and d:get(keys[i + 1])
    if not v and i + 1 < n then
        v = d:get(keys[i + 2])
        if not v and i + 2 < n then
            v = d:get(keys[i + 3])
            if not v and i + 3 < n then
                v = d:get(keys[i + 4])
            end
        end
    end
    if not v then
        if final then
            metrics.l1(api, "miss")
        end
        return false
    end
    local e = entry_of(v)
    local a = APIS[api]
    local id = e and fresh_id(a)
    if not id then
        ngx_log(ngx_WARN, "zccp: L1 entry unusable; asking the engine")
        return false
    end
    -- the replay's id and `created` into the entry's slots: nothing yields between here
    -- and ngx.print, so no other request sees these parts half-filled
    -- (a JSON answer has one id and at most one `created`: no loop; an SSE one, several)
    local parts, ids, crs = e.parts, e.ids, e.crs
    local nid, ncr = #ids, #crs
    parts[ids[1]] = id
    if nid > 1 then
        for j = 2, nid do
            parts[ids[j]] = id
        end
    end
    local now = ngx_time()
    if ncr > 0 then
        local created = tostring(now)
        parts[crs[1]] = created
        if ncr > 1 then
            for j = 2, ncr do
                parts[crs[j]] = created
            end
        end
        ncr = ncr * #created
    end
    ngx.status = 200
    if e.sse then
        ngx_header["Content-Type"] = "text/event-stream; charset=utf-8"
        ngx_header["Cache-Control"] = "no-cache"
        ngx_header["X-Accel-Buffering"] = "no"
    else
        ngx_header["Content-Type"] = "application/json"
        ngx_header["Content-Length"] = e.fixed + nid * a.id_len + ncr
    end
    ngx_header["X-ZCCP-Cache"] = "HIT"
    ngx_header["X-ZCCP-Cache-Layer"] = "L1"
    -- the engine's context id for these bytes (the first 8 bytes of their SHA-256): L1
    -- answers carry it too, for the logs (zccp_json) and the client
    ngx_header["X-ZCCP-Context-Id"] = hex8(k.digest)
    local age = now - e.born
    ngx_header["Age"] = age > 0 and age or 0
    ngx_print(parts)
    metrics.l1(api, "hit")
    if settings.keys_on() then   -- a metered request (zccp.limits' ticket in ngx.ctx); else no ngx.ctx
        limits.observe_counts(e.pin, e.pout, "HIT")
    end
    return true
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
-- lookup in the parsed entries (bench/string_hash.lua: 3.6 µs per hit with 2,000 such
-- entries, 38 with 16,000; 0.08 and 0.09 tagged). Identical entries stay one string.
local function tag_of(born, pin, pout)
    local tag = str_reverse(tohex(bxor(born, rol(pin, 11), rol(pout, 21))))   -- low digits first
    return tag
end

-- The entries now in the dict (expired ones freed first); at most once a second.
local function recount(d, md, n)
    if not md:add(RECOUNT, true, 1) then
        return n
    end
    d:flush_expired()
    n = #d:get_keys(0)
    md:set(COUNT, n)
    return n
end

-- After a complete answer to the request of keys `k`: keeps it when the engine replayed
-- it as an exact HIT and allows it (meta.cache_ttl_s > 0) for at most cache.l1.ttl_s, under
-- the scope the engine names. meta: the slot's meta (shared memory: checked); r: the relay
-- record (status, sse, parts, np; an SSE answer's parts when state.keep asked for them).
function _M.keep(api, k, meta, r)
    local C = abi.C
    if r.status ~= 200 or tonumber(meta.cache_status) ~= tonumber(C.ZCCP_CACHE_HIT) then
        return
    end
    local ttl, scope, age = tonumber(meta.cache_ttl_s), tonumber(meta.cache_scope), tonumber(meta.age_s)
    if ttl <= 0 or (scope ~= 0 and scope ~= 1) or (r.sse and not r.keep) then
        return
    end
    local cfg = k.cfg
    if ttl > cfg.ttl_s then
        ttl = cfg.ttl_s
    end
    if r.acked > cfg.max_entry then
        return
    end
    local tpl = template(APIS[api], concat(r.parts, "", 1, r.np))
    if not tpl then
        ngx_log(ngx_WARN, "zccp: an answer the engine marked keepable has no response id; not kept in L1")
        return
    end
    local d, md, keys = k.dict, meta_dict(), k.keys
    local n = md:get(COUNT) or 0
    if n + #keys / 2 > cfg.max_entries then
        n = recount(d, md, n)
        if n + #keys / 2 > cfg.max_entries then
            return
        end
    end
    -- under each of its keys (the raw bytes', the exact request's): the pair's shared
    -- key or its tenant's, as the engine said
    local born, pin, pout = ngx_time() - age, tonumber(meta.prompt_len) or 0, tonumber(meta.completion_len) or 0
    local v = tag_of(born, pin, pout) .. (r.sse and "S" or "J") .. born .. "," .. pin .. "," .. pout .. ":" .. tpl
    for i = scope == 0 and 1 or 2, #keys, 2 do
        local ok, err = d:set(keys[i], v, ttl)
        if not ok then
            ngx_log(ngx_WARN, "zccp: L1 store failed: ", err)
            return
        end
        md:incr(COUNT, 1, 0)
    end
    metrics.l1(api, "store")
end

-- Empties L1 for every worker (one shared dict): a new epoch first (so an answer relayed
-- across the purge is stored under keys nobody looks up), then every entry goes.
function _M.purge()
    local md = meta_dict()
    if md then
        md:incr(EPOCH, 1, 0)
        md:set(COUNT, 0)
    end
    local l1 = settings.get().l1
    local d = l1 and ngx_shared[l1.dict]
    if d then
        d:flush_all()
        d:flush_expired()
    end
end

return _M
