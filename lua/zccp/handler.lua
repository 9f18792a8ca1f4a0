-- The request path: cheap checks, claim a slot, write the body into it with one
-- copy, ring the engine, then relay the response it commits into the slot
-- (zccp.relay). Every path releases the slot and the arena reference.
local ffi = require "ffi"
local bit = require "bit"
local abi = require "zccp.abi"
local arena_mod = require "zccp.arena"
local slots = require "zccp.slots"
local doorbell = require "zccp.doorbell"
local sha256 = require "zccp.sha256"
local fingerprint = require "zccp.fingerprint"
local errors = require "zccp.errors"
local libc = require "zccp.libc"
local relay = require "zccp.relay"
local settings = require "zccp.settings"
local tenant = require "zccp.tenant"
local mask_store = require "zccp.mask_store"
local body_mod = require "zccp.body"
local l1 = require "zccp.l1"
local metrics = require "zccp.metrics"
local auth = require "zccp.auth"
local admin_gate = require "zccp.admin"
local limits = require "zccp.limits"
local engines = require "zccp.engines"
local router = require "zccp.router"

local ngx = ngx
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_flush = ngx.flush
local ngx_now = ngx.now
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local ffi_copy = ffi.copy
local ffi_fill = ffi.fill
local ffi_string = ffi.string
local str_find = string.find
local str_lower = string.lower
local str_match = string.match
local tonumber = tonumber
local error = error
local pcall = pcall

local _M = { _VERSION = "0.1.0" }

local POLL_MS = 250     -- how often a waiting request checks its deadline and the client
local MAX_ATTEMPTS = 2  -- a ring rejected as stale after an engine restart is retried once
local RETRY_AFTER = { ["Retry-After"] = "1" }

local function is_json(ct)
    ct = str_lower(ct)   -- media types are case-insensitive
    return str_find(ct, "^%s*application/json") or str_find(ct, "^%s*application/[%w.-]+%+json")
end

-- X-ZCCP-Cache-Sampled: on | off, the request's override of cache.sampled (docs/cache.md)
local function sampled_flag(C)
    local v = ngx_var.http_x_zccp_cache_sampled
    if not v then
        return 0
    end
    v = str_lower(v)
    if str_find(v, "^%s*on%s*$") then
        return C.ZCCP_FLAG_SAMPLED_ON
    elseif str_find(v, "^%s*off%s*$") then
        return C.ZCCP_FLAG_SAMPLED_OFF
    end
    return 0
end

local function cache_flags()
    local C = abi.C
    local cc = ngx_var.http_cache_control
    local f = sampled_flag(C)
    if not cc then
        return f
    end
    if str_find(cc, "no-cache", 1, true) then
        f = f + C.ZCCP_FLAG_NO_CACHE
    end
    if str_find(cc, "no-store", 1, true) then
        f = f + C.ZCCP_FLAG_NO_STORE
    end
    return f
end

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

-- Fill the claimed slot and mark it READY. Returns the generation rung with, or nil,
-- message[, status, kind] (a status when the client's body failed, not the arena).
-- src: { body = string[, digest = its SHA-256 (zccp.l1)] } or { len = n, deadline = t }
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
    if src.digest then
        ffi_copy(h.sha256, src.digest, 32)
    else
        local ok, err = sha256.digest_into(dst, n, h.sha256)
        if not ok then
            return nil, err
        end
    end
    ffi_copy(h.context_id, h.sha256, 8)
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
-- Every write to the slot after the fill is conditioned on it (issue 20).
local function owned(slot)
    return slot.header.generation == slot.generation and slots.owns(slot.arena, slot.index, slot.token)
end

-- The slot a request holds: claimed, filled and rung. release() frees it on every path,
-- and touches nothing that is no longer this request's.
local function release(slot)
    if owned(slot) then
        slot.header.state = abi.C.ZCCP_STATE_FREE
    end
    slots.release(slot.arena, slot.index, slot.token)
end

-- Claims a slot of arena `a` and fills it: the slot record, or nil, status, kind, message.
local function claim_and_fill(a, src, flags, fp, extra, rid)
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
local function ring(slot, e)
    local bell, berr = doorbell.open(e)
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
local function hang_up(slot, complete)
    local bell = slot.bell
    slot.bell = nil
    if not bell then
        return
    end
    if complete then
        bell:keep()
    else
        if owned(slot) then
            slot.header.deadline_ns = 1
        end
        bell:close()
    end
end

-- Streams nginx ended although the answer went on (limits.stream_*): the metric's
-- reason, and what the client that still reads is told.
local STREAM_ENDS = {
    stalled = { reason = "stalled" },
    stream_duration = { reason = "duration", limit = "limits.stream_max_duration_ms" },
    stream_bytes = { reason = "bytes", limit = "limits.stream_max_bytes_kb" },
}

-- A stream ended by its limits: counted, logged; the error event goes to a client that
-- reads. A stalled one gets nothing more: "close" asks serve() to close its connection
-- once everything the request holds is released.
local function end_stream(api, slot, outcome)
    local e = STREAM_ENDS[outcome]
    metrics.stream_ended(api, e.reason)
    ngx_log(ngx_WARN, "zccp: request ", slot.request_id, " (context ", slot.ctx_hex, ") on slot ", slot.index,
            ": stream ended: ", e.reason)
    if not e.limit then
        return "close"
    end
    ngx_print(errors.sse_event(api, "api_error", "stream ended by the gateway: it reached " .. e.limit))
    ngx_flush(true)
end

-- Answers the client from the relay's outcome. Returns "retry" when the engine behind
-- the arena changed before anything was sent (a stale ring).
local function respond(api, slot, outcome, r)
    if STREAM_ENDS[outcome] then
        return end_stream(api, slot, outcome)
    end
    if outcome == "done" then
        if not r.sse then
            local body = auth.models_body(r.parts)   -- GET /v1/models: the key's models only
            ngx_header["Content-Length"] = body and #body or r.acked
            ngx_print(body or r.parts)
        end
        return
    end
    if outcome == "retry" and not r.started then
        return "retry"
    end
    if outcome == "client closed the connection" then
        return   -- nobody is listening; the access log shows the client's close
    end
    ngx_log(outcome == "timeout" and ngx_WARN or ngx_ERR, "zccp: request ", slot.request_id, " (context ",
            slot.ctx_hex, ") on slot ", slot.index, ": ", outcome)
    local code, kind, msg
    if outcome == "timeout" then
        code, kind, msg = 504, "api_error", "request timed out after " .. settings.get().request_timeout_ms .. " ms"
    else
        code, kind, msg = 503, "overloaded_error", "engine failed: " .. outcome
    end
    if not r.started then
        return errors.send(api, code, kind, msg, code == 503 and RETRY_AFTER or nil)
    end
    if r.sse then
        ngx_print(errors.sse_event(api, kind, msg))
        ngx_flush(true)
    end
end

-- Admin requests (kinds "purge": POST /v1/zccp/purge, "warmup": POST /v1/zccp/warmup)
-- and POST /v1/zccp/l1/purge answer on the admin listener only, with its token
-- (zccp.admin), never by the client's address.
local ADMIN_KINDS = { purge = "ZCCP_KIND_PURGE", warmup = "ZCCP_KIND_WARMUP" }
-- The model endpoints anyone may call: POST /v1/messages/count_tokens, GET /v1/models.
local MODEL_KINDS = { count_tokens = "ZCCP_KIND_COUNT_TOKENS", models = "ZCCP_KIND_MODELS" }
-- The OpenAI endpoints beside chat completions (request.openai_api).
local OPENAI_ENDPOINTS = { completions = "ZCCP_OPENAI_COMPLETIONS", responses = "ZCCP_OPENAI_RESPONSES" }


-- What the relay reports when the engine itself failed (it closed the doorbell, broke the
-- protocol, sent nonsense): any outcome but these. Before anything was sent, such a
-- request goes to the next engine in rank (attempts).
local NOT_ENGINE_FAILURES = { done = true, retry = true, timeout = true, ["client closed the connection"] = true,
                              stalled = true, stream_duration = true, stream_bytes = true }

-- One attempt against engine e's arena a: claim, fill and ring, relay, respond. Returns
-- "retry" when the engine behind the arena changed under us (stale ring); "next", status,
-- kind, message when this engine cannot take it and nothing was sent (its slots are all
-- claimed, its doorbell refused, it failed before answering): attempts() tries the next
-- engine, or answers that; otherwise the request is answered. state.slot is set while a
-- slot is held, so that attempts() can free it if anything here raises. r: the request
-- prepare() made.
local function attempt(r, a, state, e)
    local api, src = r.api, r.src
    local slot, code, kind, msg = claim_and_fill(a, src, r.flags, r.fp, r.extra, state.request_id)
    if not slot then
        if code == 499 then
            return   -- the client left during its upload: nobody to answer
        end
        if code == 429 or code == 503 then   -- this engine's slots or arena, not the client's body
            return "next", code, kind, msg
        end
        return errors.send(api, code, kind, msg)
    end
    state.slot = slot
    local k = state.l1
    if k and k.pending then   -- a streamed body: L1 by the digest of the bytes now in the slot
        l1.digested(k, ffi_string(slot.header.sha256, 32))
        if l1.serve(api, k, true) then
            release(slot)
            state.slot = nil
            return
        end
    end
    local ok, rerr = ring(slot, e)
    if not ok then
        hang_up(slot, false)
        release(slot)
        state.slot = nil
        router.down(e)
        return "next", 503, "overloaded_error", rerr
    end
    if r.multi then
        ngx_header["X-ZCCP-Engine"] = e.name
    end
    local outcome, res = relay.run(slot, state, r.deadline)
    limits.observe(a:meta(slot.index), slot.cache, outcome, res)   -- the engine's exact counts, settled in the log phase
    if outcome == "done" and k then
        local kept, kerr = pcall(l1.keep, api, k, a:meta(slot.index), res)
        if not kept then
            ngx_log(ngx_ERR, "zccp: L1 store failed: ", kerr)
        end
    end
    if outcome == "retry" and not src.body then
        -- the streamed body exists only in this slot: keep it for the next attempt
        src.body = ffi_string(a:payload_ptr(slot.index), src.len)
    end
    hang_up(slot, outcome == "done")
    release(slot)
    state.slot = nil
    if not NOT_ENGINE_FAILURES[outcome] and not ngx.headers_sent then
        ngx_log(ngx_ERR, "zccp: request ", slot.request_id, " (context ", slot.ctx_hex, ") on engine ", e.name,
                " slot ", slot.index, ": ", outcome)
        router.down(e)
        return "next", 503, "overloaded_error", "engine failed: " .. outcome
    end
    return respond(api, slot, outcome, res)
end

-- Step 1, before any body byte is read: who may call (admin kinds: the admin listener),
-- the method, the content type and the declared size. Returns true and the declared
-- Content-Length (nil when there is none), or false once the request is answered.
local function admit(api, kind, s)
    if kind and ADMIN_KINDS[kind] and not admin_gate.allowed(api) then
        return false
    end
    local method = ngx.req.get_method()
    local want = kind == "models" and "GET" or "POST"
    if method ~= want then
        errors.send(api, 405, "invalid_request_error", "method " .. method .. " not allowed; use " .. want,
            { Allow = want })
        return false
    end
    local ct = ngx_var.content_type
    if want == "POST" and ct and not is_json(ct) then
        errors.send(api, 415, "invalid_request_error",
            "content-type " .. ct .. " is not supported; send application/json")
        return false
    end
    local len = tonumber(ngx_var.content_length)
    if len and len > s.max_body then
        errors.send(api, 413, "request_too_large",
            "request body of " .. len .. " bytes exceeds the limit of " .. s.max_body .. " bytes")
        return false
    end
    return true, len
end

-- The payload as fill_slot takes it: { body = string }, or { len = n, deadline = t } for a
-- body streamed later straight into the slot; nil once the request is answered (a body
-- that could not be read). GET /v1/models/{id}: the id is the payload.
local function payload(api, kind, len, max_body, deadline, whole)
    if kind == "models" then
        return { body = _M.model_id(ngx_var.uri) or "" }
    end
    if body_mod.streamable(len, fingerprint.DECODE_LIMIT) and not whole then
        return { len = len, deadline = deadline }
    end
    local body, code, err_kind, msg = body_mod.read(max_body, deadline)
    if not body then
        errors.send(api, code, err_kind, msg)
        if code == 408 then
            return ngx.exit(ngx.HTTP_OK)   -- the answer is out; stops the pending body read (body.read)
        end
        return nil
    end
    return { body = body }
end

-- A generation's cache side in nginx (r.flags set): L1 (zccp.l1) answers the very same
-- bytes before any fingerprint (a streamed body's once it is in the slot, see attempt),
-- the same request after its keys; otherwise the engine's answer may be kept. Sets r.fp
-- and r.extra (the tenant); false once the request is answered from L1.
local function cache_keys(r, body, state)
    local api, flags = r.api, r.flags
    if r.endpoint then
        -- /v1/completions, /v1/responses: no L1 (its keys name the API, not the endpoint) and
        -- no keys from nginx; the engine fingerprints these bodies itself, under keys that
        -- name the endpoint (docs/fingerprint.md, "Other endpoints")
        local t = tenant.digest(nil)
        r.extra = { tenant = t, openai_api = abi.C[OPENAI_ENDPOINTS[r.endpoint]] }
        return true
    end
    local k = l1.begin(api, body, flags)
    if k and not k.pending and l1.serve(api, k) then
        return false
    end
    -- A streamed body is the engine's to fingerprint; a request that neither reads nor
    -- writes the cache (no-cache + no-store) needs no keys at all.
    local bypass = abi.C.ZCCP_FLAG_NO_CACHE + abi.C.ZCCP_FLAG_NO_STORE
    local fp = body and bit.band(flags, bypass) ~= bypass and fingerprint.keys(api, body) or nil
    local t = tenant.digest(fp)
    r.fp, r.extra = fp, t and { tenant = t }
    if k then
        l1.exact(k, fp, t)
        if not k.pending and l1.serve(api, k, true) then
            return false
        end
        state.l1, state.keep = k, l1.max_entry(k)
        r.src.digest = k.digest
    end
    if fp then
        fingerprint.complete(fp)   -- the near-duplicate part: only the engine needs it
    end
    return true
end

-- Step 2: the body, the slot flags, and for a generation its keys. Returns the request
-- r = { api, kind, src, body_len, deadline, flags, fp, extra } for attempts(), or nil
-- once it is answered (a body that could not be read, an L1 hit).
local function prepare(api, kind, kind_name, s, len, state, who, endpoint)
    local deadline = ngx_now() + s.request_timeout_ms / 1000
    local src = payload(api, kind, len, s.max_body, deadline, auth.wants_body(who) or router.needs_body())
    if not src then
        return nil
    end
    local body = src.body
    -- the key's models and limits (zccp.auth, zccp.limits), before L1: a 404 or 429 either way
    if kind ~= "models" and not auth.allow_model(who, api, body)
            or not limits.admit(who, api, body, kind, state.request_id) then
        return nil
    end
    local flags = kind and 0 or cache_flags()
    if api == "openai" then
        flags = flags + abi.C.ZCCP_FLAG_API_OPENAI
    end
    local r = { api = api, kind = kind, src = src, body_len = body and #body or len, deadline = deadline,
                flags = flags, endpoint = endpoint }
    if kind then
        r.extra = { kind = abi.C[kind_name] }
        if kind == "purge" then
            l1.purge()   -- before the engine purges Redis, and again after (attempts)
        end
    elseif not cache_keys(r, body, state) then
        return nil
    end
    if engines.multi() then   -- which engines may take it (zccp.router)
        r.multi = true
        local wfp = kind == "warmup" and body and fingerprint.keys(api, body)
        if wfp then   -- warm the replica the conversation's turns will go to
            r.route_key = wfp.route_key
        end
        r.model = wfp and wfp.model or kind ~= "models" and kind ~= "purge" and router.model_of(r, body) or nil
    end
    return r
end

-- A bug in attempt() (it raised `err`) must not leak a slot or a doorbell connection.
local function abandon(r, a, state, err)
    ngx_log(ngx_ERR, "zccp: request failed: ", err)
    if state.slot then
        hang_up(state.slot, false)
        release(state.slot)
        state.slot = nil
    end
    a:release()
    if not ngx.headers_sent then
        return errors.send(r.api, 500, "api_error", "internal error in the gateway")
    end
end

-- Step 3: attempt() against the engines the router ranks (zccp.router; the one engine
-- without engines:), once more on a stale ring (an engine restarted before anything was
-- sent); an engine that cannot take the request hands it to the next one. Answers the
-- last refusal when none could.
local function attempts(r, state)
    local api = r.api
    local order, spilled, failed_over = router.order(r)
    local code, kind, msg = 503, "overloaded_error", "engine restarted; retry"
    local passed_busy, passed_failed = false, false   -- what the engines ranked above the one that takes it did
    for k = 1, #order do
        local e = order[k]
        for _ = 1, MAX_ATTEMPTS do
            local a, err = arena_mod.acquire(e)
            if not a then
                router.down(e)
                code, kind, msg = 503, "overloaded_error", err
                passed_failed = true
                break
            end
            if r.body_len > a.payload_cap then
                a:release()
                return errors.send(api, 413, "request_too_large",
                    "request body of " .. r.body_len .. " bytes exceeds the slot capacity of " .. a.payload_cap
                    .. " bytes")
            end
            local ok, res, rcode, rkind, rmsg = pcall(attempt, r, a, state, e)
            if r.kind == "purge" then
                l1.purge()   -- what was relayed from Redis while it was purged is gone too
            end
            if not ok then
                return abandon(r, a, state, res)
            end
            a:release()
            if res == "next" then
                code, kind, msg = rcode, rkind, rmsg
                if rcode == 429 then
                    passed_busy = true
                else
                    passed_failed = true
                end
                break
            end
            if res ~= "retry" then
                if r.multi then   -- all slots claimed above it: spilled; down or failed above it: failed over
                    metrics.routed(e.name, k == 1 and spilled or passed_busy, failed_over or passed_failed)
                end
                if res == "close" then
                    return ngx.exit(ngx.HTTP_CLOSE)   -- a client that stopped reading: nothing more is sent
                end
                return res
            end
            arena_mod.refresh(e)
            code, kind, msg = 503, "overloaded_error", "engine restarted; retry"
        end
    end
    return errors.send(api, code, kind, msg, RETRY_AFTER)
end

-- nginx refused the body itself (client_max_body_size): same answer, API-shaped.
function _M.too_large(api)
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    return errors.send(api, 413, "request_too_large",
        "request body exceeds the limit of " .. settings.get().max_body .. " bytes")
end

-- nginx refused the request's header lines (large_client_header_buffers: error 494),
-- answered 431 in the shape of the API the path names, and the connection is closed.
function _M.header_too_large()
    local uri = ngx_var.uri
    local api = (uri == "/v1/chat/completions" or uri == "/v1/completions" or uri == "/v1/responses")
                and "openai" or "anthropic"
    return errors.send(api, 431, "invalid_request_error",
        "request header fields too large: each header line must fit in nginx's large_client_header_buffers")
end

-- Content handler for POST /v1/messages ("anthropic") and /v1/chat/completions ("openai");
-- kind: "purge" or "warmup" (admin listener), "count_tokens" or "models" (GET);
-- endpoint: "completions" or "responses" (api "openai": /v1/completions, /v1/responses).
function _M.serve(api, kind, endpoint)
    local s = settings.get()
    local rid = ngx_var.zccp_request_id
    ngx_header["X-Request-ID"] = rid
    local kind_name = kind and (ADMIN_KINDS[kind] or MODEL_KINDS[kind]
                                or error("zccp.handler.serve: unknown kind " .. kind, 2))
    local admitted, len = admit(api, kind, s)
    if not admitted then
        return
    end
    local who = ADMIN_KINDS[kind or ""] and auth.OFF or auth.admit(api)   -- the API key: 401 before the body
    if not who then
        return
    end
    local state = { aborted = false, request_id = rid }
    ngx.on_abort(function() state.aborted = true end)
    if endpoint and not OPENAI_ENDPOINTS[endpoint] then
        error("zccp.handler.serve: unknown endpoint " .. endpoint, 2)
    end
    local r = prepare(api, kind, kind_name, s, len, state, who, endpoint)
    if not r then
        return
    end
    return attempts(r, state)
end

-- POST /v1/zccp/l1/purge (the admin listener, like the purge): empties this nginx's L1 and
-- nothing else; `zccp-cache purge` calls it after purging Redis (docs/cache.md).
function _M.purge_l1()
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    if not admin_gate.allowed("anthropic") then
        return
    end
    local method = ngx.req.get_method()
    if method ~= "POST" then
        return errors.send("anthropic", 405, "invalid_request_error", "method " .. method .. " not allowed; use POST",
            { Allow = "POST" })
    end
    l1.purge()
    ngx_header["Content-Type"] = "application/json"
    ngx_print('{"purged_l1":true}')
end

-- Any path ZCCP does not serve (the standalone server's catch-all): the API's own 404,
-- OpenAI-shaped under /v1/chat/, Anthropic-shaped elsewhere.
function _M.not_found()
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    local api = str_find(ngx_var.uri, "^/v1/chat/") and "openai" or "anthropic"
    return errors.send(api, 404, "not_found_error", "no such endpoint: " .. ngx.req.get_method() .. " " .. ngx_var.uri)
end

-- The {id} of /v1/models/{id} (letters, digits and ._:-), or nil.
function _M.model_id(uri)
    return str_match(uri, "^/v1/models/([A-Za-z0-9._:-]+)$")
end

-- GET /v1/models (and /v1/models/{id}): Anthropic's shape when the client says
-- anthropic-version (the Anthropic SDK always does), OpenAI's otherwise.
function _M.serve_models()
    local api = ngx_var.http_anthropic_version and "anthropic" or "openai"
    local uri = ngx_var.uri
    if uri ~= "/v1/models" and not _M.model_id(uri) then   -- the standalone's prefix location
        ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
        return errors.send(api, 404, "not_found_error", "no model path " .. uri .. "; use /v1/models/{id}")
    end
    return _M.serve(api, "models")
end

return _M
