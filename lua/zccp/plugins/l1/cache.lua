-- nginx's L1 cache (docs/cache.md, "L1 in nginx"): the answers the engine replayed as an
-- exact HIT and marked keepable (meta.cache_ttl_s > 0, meta.cache_scope) live in a
-- lua_shared_dict, so that the next identical request is answered here, in the handler
-- that computed its key: no slot, no doorbell, no engine, no Redis. Redis stays the L2.
-- An answer is kept under the digest of the request's raw bytes (found before any
-- fingerprint) and, for a request nginx fingerprinted and did not mask, its exact key.
--
--   local l1 = require "zccp.plugins.l1.cache"
--   local k = l1.begin(api, body, flags, who)        -- nil: this request skips L1
--   if k and l1.serve(api, k) then return end        -- the very same bytes: answered, no fingerprint
--   ... fp = fingerprint.keys(api, body) ...
--   l1.exact(k, fp, tenant)                           -- the same request, other bytes
--   if l1.serve(api, k, true) then return end         -- (true: the last try, a miss is counted)
--   state.keep = k and l1.max_entry(k)                -- relay: keep an SSE answer's bytes
--   l1.keep(api, k, meta, r)                          -- after a complete answer (relay record r)
--   l1.purge()                                        -- every worker's L1 (one shared dict)
--
-- Only exact HIT replays are kept, never a model's answer: a replay's bytes are what the
-- engine would send again, a model's carry per-run numbers (usage's cached prompt tokens).
-- The entries' format and the fresh ids: plugins/l1/entry.lua.
local bit = require "bit"
local abi = require "zccp.lib.abi"
local settings = require "zccp.settings"
local sha256 = require "zccp.lib.sha256"
local metrics = require "zccp.lib.metrics"
local tenant_mod = require "zccp.lib.tenant"
local arena_mod = require "zccp.lib.arena"
local entry = require "zccp.plugins.l1.entry"

local ngx = ngx
local ngx_shared = ngx.shared
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_time = ngx.time
local ngx_log = ngx.log
local ngx_WARN = ngx.WARN
local band = bit.band
local concat = table.concat
local tonumber = tonumber
local tostring = tostring

local _M = { _VERSION = "0.1.0" }

local APIS, fresh_id, hex8, entry_of = entry.APIS, entry.fresh_id, entry.hex8, entry.entry_of
local template, tag_of = entry.template, entry.tag_of

local SEP = "\0"
-- Kept in the slots' dict (settings.dict), which does not evict: the purge epoch (part of
-- every key, so an answer relayed across a purge is never found again), the approximate
-- entry count, and the once-a-second recount lock.
local EPOCH, COUNT, RECOUNT = "l1:epoch", "l1:count", "l1:recount"
local SHARED_EPOCH = "l1:purge_epoch"   -- the cache's purge epoch this nginx's L1 was last emptied for

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
-- zccp.core.body), `pending` until digested() gives it the slot's. Their tenant is the one
-- known without the body (the headers'): identical bytes name the same end user.
-- The cache's purge epoch (zccp.lib.arena.purge_epoch), as a string, or nil (unknown: no L1).
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

function _M.begin(api, body, flags, who)
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
    local tenant = tenant_mod.digest(nil, who)
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
-- tenant: the request's tenant (zccp.lib.tenant.digest(fp)). True when it added them.
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
    k.hit_in, k.hit_out = e.pin, e.pout   -- what the hit saved (the l1 plugin: r.served)
    return true
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
