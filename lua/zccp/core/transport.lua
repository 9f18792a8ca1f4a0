-- The transport: claim a slot, fill it with one copy of the body, ring the engine,
-- hang up, release. Plugins never touch a slot: only this module (and zccp.core.relay) does.
local ffi = require "ffi"
local abi = require "zccp.lib.abi"
local arena_mod = require "zccp.lib.arena"
local slots = require "zccp.lib.slots"
local doorbell = require "zccp.lib.doorbell"
local sha256 = require "zccp.lib.sha256"
local libc = require "zccp.lib.libc"
local settings = require "zccp.settings"
local mask_store = require "zccp.fp.mask_store"
local body_mod = require "zccp.core.body"

local ngx = ngx
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ffi_copy = ffi.copy
local ffi_fill = ffi.fill
local ffi_string = ffi.string
local band = require("bit").band
local mono_s = libc.mono_s
local ngx_req_start_time = ngx.req.start_time
local tonumber = tonumber
local str_sub = string.sub
local str_match = string.match
local str_lower = string.lower
local str_find = string.find
local ZERO_TRACE = string.rep("0", 32)
local ZERO_SPAN = string.rep("0", 16)

local _M = { _VERSION = "0.1.0" }

local POLL_MS = 250     -- how often a waiting request checks its deadline and the client

-- Cache keys for the engine: bounded work (bodies up to fingerprint.DECODE_LIMIT,
-- at most 1024 prompt tokens). A body nginx does not fingerprint is not an error:
-- the engine validates it, and fingerprints it itself when it is large.
local function write_fingerprint(a, i, fp)
    local C = abi.C
    local h, meta, sig = a:header(i), a:meta(i), a:signature(i)
    ffi_copy(meta.exact_key, fp.exact_key, 32)
    ffi_copy(a:request(i).prefix_key, fp.prefix_key, 32)
    meta.fp_tokens = fp.tokens
    local f = C.ZCCP_FLAG_FP_VALID
    if fp.near then   -- a text-only final user turn: its CSF, and near hits allowed
        h.csf_key = fp.csf_key
        for b = 1, C.ZCCP_CSF_BANDS do
            meta.csf_bands[b - 1] = fp.bands[b]
        end
        ffi_copy(sig.minhash, fp.signature, C.ZCCP_SLOT_SIG_SIZE)
        f = f + C.ZCCP_FLAG_FP_COMPLETE
    end
    if fp.masked then
        f = f + C.ZCCP_FLAG_MASKED
    end
    return f
end

-- The request id and the mask set this worker applied (the engine follows it) into the
-- request block `req`. Returns the flag it sets.
local function write_ids(req, rid)
    local C = abi.C
    local n = #rid
    if n > C.ZCCP_REQUEST_ID_MAX then
        n = C.ZCCP_REQUEST_ID_MAX
    end
    req.request_id_len = n
    ffi_copy(req.request_id, rid, n)
    local digest = mask_store.digest_raw()
    if not digest then
        return 0
    end
    ffi_copy(req.mask_digest, digest, 32)
    return C.ZCCP_FLAG_MASK_DIGEST
end

-- A W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>", neither id all zeros) into the request
-- block, and nginx's timings for the engine's request span (docs/observability.md): two
-- stores per request; the header only parsed when the client sent one.
local function hex_into(dst, hex, n)
    for k = 0, n - 1 do
        dst[k] = tonumber(str_sub(hex, 2 * k + 1, 2 * k + 2), 16)
    end
end

-- The client's tracestate beside its traceparent: visible ASCII, at most ZCCP_TRACESTATE_MAX
-- bytes (cut after the last whole entry that fits, as W3C allows), in the payload region
-- after the body's n bytes when it fits there (zccp_abi.h).
local function write_tracestate(req, ts, dst, n, cap)
    if not ts or ts == "" or str_find(ts, "[^\32-\126]") then
        return
    end
    local max = abi.C.ZCCP_TRACESTATE_MAX
    if #ts > max then
        local cut = str_find(str_sub(ts, 1, max + 1), ",[^,]*$")
        if not cut then
            return
        end
        ts = str_sub(ts, 1, cut - 1)
    end
    if n + #ts <= cap then
        ffi_copy(dst + n, ts, #ts)
        req.tracestate_len = #ts
    end
end

-- A client's traceparent into dst's trace_id, parent_span_id and trace_flags (a request
-- block, or an L1 hit's span record: zccp.plugins.l1.spans): true when valid.
function _M.read_traceparent(dst, tp)
    if not tp or #tp ~= 55 then
        return false
    end
    local tid, sid, fl = str_match(tp, "^00%-(%x+)%-(%x+)%-(%x%x)$")
    if not tid or #tid ~= 32 or #sid ~= 16 or tid == ZERO_TRACE or sid == ZERO_SPAN then
        return false
    end
    hex_into(dst.trace_id, str_lower(tid), 16)
    hex_into(dst.parent_span_id, str_lower(sid), 8)
    dst.trace_flags = 256 + tonumber(fl, 16)
    return true
end

local function write_trace(req, src, dst, n, cap)
    if src.own then   -- nginx's own request (a timer's: no client, no request line)
        return
    end
    req.nginx_start_ns = ngx_req_start_time() * 1e9
    if src.t0 then
        req.nginx_admit_us = (mono_s() - src.t0) * 1e6
    end
    if _M.read_traceparent(req, src.traceparent) then
        write_tracestate(req, src.tracestate, dst, n, cap)
    end
end

-- The context id of a request that uses no cache (no-cache + no-store: no lookup, no
-- store, no L1): 8 random bytes (libcrypto's CSPRNG, well under a microsecond) instead of
-- the body's SHA-256 (~470 us at 512 KiB), which only a cache key needs. Made once per
-- request (kept in src), so every attempt and the 503 nobody answered carry the same id.
-- nil for any other request (its id is the digest's first 8 bytes), or when RAND_bytes
-- fails (the digest then, as before). Cut from a pool of TRACE_POOL bytes drawn in one
-- call (each RAND_bytes is also a getpid(2): OpenSSL's fork check), in the worker, at
-- its first id: never copied from the master into several workers.
local BYPASS  -- ZCCP_FLAG_NO_CACHE + ZCCP_FLAG_NO_STORE, once the ABI is loaded
local TRACE_POOL = 1024
local trace_pool = ffi.new("unsigned char[?]", TRACE_POOL)
local trace_at = TRACE_POOL   -- the next id's offset in the pool

function _M.trace_id(src, flags)
    local id = src.trace
    if id then
        return id
    end
    if not BYPASS then
        BYPASS = abi.C.ZCCP_FLAG_NO_CACHE + abi.C.ZCCP_FLAG_NO_STORE
    end
    if src.digest or band(flags, BYPASS) ~= BYPASS then
        return nil
    end
    if trace_at + 8 > TRACE_POOL then
        if not sha256.random_into(trace_pool, TRACE_POOL) then
            return nil
        end
        trace_at = 0
    end
    id = ffi_string(trace_pool + trace_at, 8)
    trace_at = trace_at + 8
    src.trace = id
    return id
end

-- Fill the claimed slot and mark it READY. Returns the generation rung with, or nil,
-- message[, status, kind] (a status when the client's body failed, not the arena).
-- src: { body = string[, digest = its SHA-256 (zccp.plugins.l1.cache)] } or { len = n, deadline = t }
-- (streamed from the client socket);
-- extra: nil, or { kind = enum zccp_request_kind, tenant = 32-byte digest,
-- openai_api = enum zccp_openai_api }; rid: X-Request-ID.
local function fill_slot(a, i, src, flags, timeout_ms, fp, extra, rid)
    local C = abi.C
    local h, meta = a:header(i), a:meta(i)
    if h.magic ~= C.ZCCP_SLOT_MAGIC or h.payload_cap ~= a.payload_cap or h.response_cap ~= a.response_cap then
        return nil, "slot " .. i .. " header is corrupt"
    end
    local gen = h.generation + 1
    h.generation = gen
    h.state = C.ZCCP_STATE_WRITING
    h.owner_pid = ngx.worker.pid()
    local now = libc.now_ns()
    h.timestamp_ns = now   -- the sweeper leaves a slot alone until its deadline, upload included
    h.deadline_ns = now + timeout_ms * 1000000ULL
    local dst = a:payload_ptr(i)
    local body = src.body
    local n = body and #body or src.len
    if body then
        ffi_copy(dst, body, n)
    else
        local ok, status, kind, msg = body_mod.receive_into(dst, n, src.deadline)
        if not ok then
            return nil, msg, status or 499, kind
        end
    end
    h.payload_len = n
    local trace = _M.trace_id(src, flags)
    if src.digest then
        ffi_copy(h.sha256, src.digest, 32)
    elseif trace then   -- no cache key needs the digest: not computed (zccp_abi.h)
        ffi_fill(h.sha256, 32)
    else
        local ok, err = sha256.digest_into(dst, n, h.sha256)
        if not ok then
            return nil, err
        end
    end
    ffi_copy(h.context_id, trace or h.sha256, 8)
    h.status, h.response_len, h.response_acked, h.tokens_len, h.csf_key = 0, 0, 0, 0, 0
    meta.fp_tokens = 0
    local req = a:request(i)
    ffi_fill(req, C.ZCCP_SLOT_REQ_SIZE)   -- kind GENERATE, no request id, tenant or digest
    if extra then
        req.kind = extra.kind or C.ZCCP_KIND_GENERATE
        req.openai_api = extra.openai_api or C.ZCCP_OPENAI_CHAT
        if extra.tenant then
            ffi_copy(req.tenant, extra.tenant, 32)
            flags = flags + C.ZCCP_FLAG_TENANT
        end
    end
    flags = flags + write_ids(req, rid)
    write_trace(req, src, dst, n, a.payload_cap)
    if fp then
        flags = flags + write_fingerprint(a, i, fp)
    end
    h.flags = flags
    meta.prompt_len, meta.completion_len, meta.cache_status = 0, 0, 0
    meta.similarity_ppm, meta.age_s, meta.plan_chunks, meta.error_code = 0, 0, 0, 0
    meta.cache_ttl_s, meta.cache_scope, meta.cache_reason, meta.committed_mark = 0, 0, 0, 0
    h.state = C.ZCCP_STATE_READY
    return gen
end

-- Whether the slot is still this request's: its claim and the generation it filled.
-- Every write to the slot after the fill is conditioned on it (a lapsed claim writes nothing).
function _M.owned(slot)
    return slot.header.generation == slot.generation and slots.owns(slot.arena, slot.index, slot.token)
end

-- The slot a request holds: claimed, filled and rung. release() frees it on every path,
-- and touches nothing that is no longer this request's.
function _M.release(slot)
    if _M.owned(slot) then
        slot.header.state = abi.C.ZCCP_STATE_FREE
    end
    slots.release(slot.arena, slot.index, slot.token)
end

-- Claims a slot of arena `a` and fills it: the slot record, or nil, status, kind, message.
function _M.claim_and_fill(a, src, flags, fp, extra, rid)
    local s = settings.get()
    local i, token = slots.claim(a)
    if not i then
        return nil, 429, "rate_limit_error", "all " .. a.slot_count .. " slots are busy; retry shortly"
    end
    local gen, ferr, status, kind = fill_slot(a, i, src, flags, s.request_timeout_ms, fp, extra, rid)
    if not gen then
        local h = a:header(i)
        if h.state == abi.C.ZCCP_STATE_WRITING then
            h.state = abi.C.ZCCP_STATE_FREE
        end
        slots.release(a, i, token)
        if status then   -- the client's body, not the arena
            return nil, status, kind, ferr
        end
        ngx_log(ngx_ERR, "zccp: ", ferr)
        return nil, 503, "overloaded_error", "engine arena unusable: " .. ferr
    end
    local h = a:header(i)
    return { arena = a, index = i, token = token, header = h, generation = gen, ctx_hex = sha256.hex(h.context_id, 8),
             request_id = rid }
end

-- Rings engine e for `slot` (slot.bell is the open doorbell): true, or nil, message.
function _M.ring(slot, e)
    local bell, berr = doorbell.open(e, slot.arena)
    if not bell then
        arena_mod.refresh(e)
        return nil, berr
    end
    slot.bell = bell
    local ok, rerr = bell:ring(slot.index, slot.generation)
    if not ok then
        return nil, "engine unavailable: doorbell send: " .. rerr
    end
    bell:set_read_timeout(POLL_MS)
    return true
end

-- Hangs up the doorbell: back to the pool after a complete answer; otherwise closed,
-- which makes the engine stop (and deadline_ns = 1 tells it even before it sees the close).
function _M.hang_up(slot, complete)
    local bell = slot.bell
    slot.bell = nil
    if not bell then
        return
    end
    if complete then
        bell:keep()
    else
        if _M.owned(slot) then
            slot.header.deadline_ns = 1
        end
        bell:close()
    end
end

return _M
