-- The request path: cheap checks, claim a slot, write the body into it with one
-- copy, ring the engine, then relay the response it commits into the slot.
-- Every path releases the slot and the arena reference.
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
local settings = require "zccp.settings"

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
local ffi_string = ffi.string
local str_format = string.format
local str_find = string.find
local str_lower = string.lower
local concat = table.concat
local tonumber = tonumber
local tostring = tostring

local _M = { _VERSION = "0.1.0" }

local POLL_MS = 250     -- how often a waiting request checks its deadline and the client
local MAX_ATTEMPTS = 2  -- a ring rejected as stale after an engine restart is retried once

local CACHE_NAMES = { [1] = "HIT", [2] = "NEAR", [3] = "MISS", [4] = "BYPASS", [5] = "ERROR" }

local function hex(ptr, n)
    local t = {}
    for k = 0, n - 1 do
        t[k + 1] = str_format("%02x", ptr[k])
    end
    return concat(t)
end

local function is_json(ct)
    ct = str_lower(ct)   -- media types are case-insensitive
    return str_find(ct, "^%s*application/json") or str_find(ct, "^%s*application/[%w.-]+%+json")
end

-- Read the body; returns it as a string or nil, status, kind, message.
local function read_body(cap)
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if not body then
        if ngx.req.get_body_file() then
            return nil, 413, "request_too_large", "request body exceeds the in-memory body buffer"
        end
        return nil, 400, "invalid_request_error", "request body is empty; expected a JSON object"
    end
    local n = #body
    if n == 0 then
        return nil, 400, "invalid_request_error", "request body is empty; expected a JSON object"
    end
    if n > cap then
        return nil, 413, "request_too_large", "request body of " .. n .. " bytes exceeds " .. cap .. " bytes"
    end
    return body
end

local function cache_flags()
    local cc = ngx_var.http_cache_control
    if not cc then
        return 0
    end
    local C = abi.C
    local f = 0
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
    h.csf_key = fp.csf_key
    for b = 1, C.ZCCP_CSF_BANDS do
        meta.csf_bands[b - 1] = fp.bands[b]
    end
    ffi_copy(meta.exact_key, fp.exact_key, 32)
    ffi_copy(sig.minhash, fp.signature, C.ZCCP_SLOT_SIG_SIZE)
    meta.fp_tokens = fp.tokens
    local f = C.ZCCP_FLAG_FP_VALID
    if fp.complete then
        f = f + C.ZCCP_FLAG_FP_COMPLETE
    end
    if fp.masked then
        f = f + C.ZCCP_FLAG_MASKED
    end
    return f
end

-- Fill the claimed slot and mark it READY. Returns the generation rung with.
local function fill_slot(a, i, body, flags, timeout_ms, fp)
    local C = abi.C
    local h, meta = a:header(i), a:meta(i)
    if h.magic ~= C.ZCCP_SLOT_MAGIC or h.payload_cap ~= a.payload_cap or h.response_cap ~= a.response_cap then
        return nil, "slot " .. i .. " header is corrupt"
    end
    local gen = h.generation + 1
    h.generation = gen
    h.state = C.ZCCP_STATE_WRITING
    h.owner_pid = ngx.worker.pid()
    local n = #body
    local dst = a:payload_ptr(i)
    ffi_copy(dst, body, n)
    h.payload_len = n
    local ok, err = sha256.digest_into(dst, n, h.sha256)
    if not ok then
        return nil, err
    end
    ffi_copy(h.context_id, h.sha256, 8)
    h.status, h.response_len, h.response_acked, h.tokens_len, h.csf_key = 0, 0, 0, 0, 0
    meta.fp_tokens = 0
    if fp then
        flags = flags + write_fingerprint(a, i, fp)
    end
    h.flags = flags
    meta.prompt_len, meta.completion_len, meta.cache_status = 0, 0, 0
    meta.similarity_ppm, meta.age_s, meta.plan_chunks, meta.error_code = 0, 0, 0, 0
    local now = libc.now_ns()
    h.timestamp_ns = now
    h.deadline_ns = now + timeout_ms * 1000000ULL
    h.state = C.ZCCP_STATE_READY
    return gen
end

local function send_headers(api, a, i, status, sse, ctx_hex)
    local meta = a:meta(i)
    ngx.status = status
    ngx_header["X-ZCCP-Context-ID"] = ctx_hex
    local cache = CACHE_NAMES[tonumber(meta.cache_status)]
    if cache then
        ngx_header["X-ZCCP-Cache"] = cache
        if cache == "NEAR" then
            ngx_header["X-ZCCP-Similarity"] = str_format("%.4f", tonumber(meta.similarity_ppm) / 1e6)
        end
        if cache == "HIT" or cache == "NEAR" then
            ngx_header["Age"] = tonumber(meta.age_s)
        end
    end
    if meta.plan_chunks > 0 then
        ngx_header["X-ZCCP-Plan"] = "chunked:" .. tonumber(meta.plan_chunks)
    end
    if sse then
        ngx_header["Content-Type"] = "text/event-stream; charset=utf-8"
        ngx_header["Cache-Control"] = "no-cache"
        ngx_header["X-Accel-Buffering"] = "no"
    else
        ngx_header["Content-Type"] = "application/json"
    end
end

-- Copy committed-but-unread bytes out of the response ring.
local function take(a, i, from, to)
    local cap = a.response_cap
    local base = a:response_ptr(i)
    local pos = from % cap
    local n = to - from
    local first = cap - pos
    if n <= first then
        return ffi_string(base + pos, n)
    end
    return ffi_string(base + pos, first) .. ffi_string(base, n - first)
end

-- One attempt against one arena. Returns "retry" when the engine behind the
-- arena changed under us (stale ring); otherwise the request is answered.
local function attempt(api, a, body, flags, deadline, state, fp)
    local s = settings.get()
    local C = abi.C
    local i = slots.claim(a)
    if not i then
        return errors.send(api, 429, "rate_limit_error", "all " .. a.slot_count .. " slots are busy; retry shortly",
            { ["Retry-After"] = "1" })
    end
    local h = a:header(i)
    local gen, ferr = fill_slot(a, i, body, flags, s.request_timeout_ms, fp)
    if not gen then
        slots.release(a, i)
        ngx_log(ngx_ERR, "zccp: ", ferr)
        return errors.send(api, 503, "overloaded_error", "engine arena unusable: " .. ferr, { ["Retry-After"] = "1" })
    end
    local ctx_hex = hex(h.context_id, 8)

    local function free_slot()
        state.cleanup = nil
        if h.generation == gen then
            h.state = C.ZCCP_STATE_FREE
        end
        slots.release(a, i)
    end
    state.cleanup = free_slot   -- run by serve() if anything below raises

    local bell, berr = doorbell.open()
    state.bell = bell
    if not bell then
        free_slot()
        arena_mod.refresh()
        return errors.send(api, 503, "overloaded_error", "engine unavailable: " .. berr, { ["Retry-After"] = "1" })
    end
    local ok, rerr = bell:ring(i, gen)
    if not ok then
        bell:close()
        free_slot()
        return errors.send(api, 503, "overloaded_error", "engine unavailable: " .. rerr, { ["Retry-After"] = "1" })
    end
    bell:set_read_timeout(POLL_MS)

    local started, sse, status = false, false, 0
    local acked = 0
    local parts, np = {}, 0
    local cap = a.response_cap
    local outcome          -- nil while running; "done", "retry" or an error description

    while true do
        local n, data = bell:read_notice()
        if not n then
            if data ~= "timeout" then
                outcome = "engine closed the doorbell: " .. tostring(data)
                break
            end
            if state.aborted then
                outcome = "client closed the connection"
                break
            end
            if ngx_now() > deadline then
                outcome = "timeout"
                break
            end
        else
            if n.slot ~= i or n.generation ~= gen then
                outcome = "doorbell protocol error: notice for another slot"
                break
            end
            if n.op == C.ZCCP_OP_REJECT then
                outcome = n.status == 409 and "retry" or ("engine rejected the ring: " .. tonumber(n.status))
                break
            end
            if n.op ~= C.ZCCP_OP_NOTICE then
                outcome = "doorbell protocol error: opcode " .. tonumber(n.op)
                break
            end
            if not started then
                status = tonumber(n.status)
                if status < 100 or status > 599 then
                    outcome = "engine sent an invalid status " .. status
                    break
                end
                sse = bit.band(h.flags, C.ZCCP_FLAG_RESPONSE_SSE) ~= 0
                send_headers(api, a, i, status, sse, ctx_hex)
                started = true
            end
            -- Committed length from the notice, cross-checked with the header.
            local committed = tonumber(n.response_len)
            if committed > tonumber(h.response_len) or committed < acked or committed - acked > cap then
                outcome = "engine committed an invalid response length"
                break
            end
            if committed > acked then
                local chunk = take(a, i, acked, committed)
                acked = committed
                h.response_acked = acked
                if sse then
                    ngx_print(chunk)
                    local fok = ngx_flush(true)
                    if not fok then
                        state.aborted = true
                    end
                else
                    np = np + 1
                    parts[np] = chunk
                end
            end
            if n.final == 1 then
                outcome = "done"
                break
            end
            if state.aborted then
                outcome = "client closed the connection"
                break
            end
        end
    end

    state.bell = nil
    if outcome == "done" then
        bell:keep()
    else
        h.deadline_ns = 1   -- tells the engine to stop at once, even before it sees the close
        bell:close()
    end
    free_slot()

    if outcome == "done" then
        if not sse then
            ngx_header["Content-Length"] = acked
            ngx_print(parts)
        end
        return
    end
    if outcome == "retry" and not started then
        return "retry"
    end
    if outcome == "client closed the connection" then
        return   -- nobody is listening; the access log shows the client's close
    end
    ngx_log(outcome == "timeout" and ngx_WARN or ngx_ERR, "zccp: request ", ctx_hex, " on slot ", i, ": ", outcome)
    local code, kind, msg
    if outcome == "timeout" then
        code, kind, msg = 504, "api_error", "request timed out after " .. s.request_timeout_ms .. " ms"
    else
        code, kind, msg = 503, "overloaded_error", "engine failed: " .. outcome
    end
    if not started then
        return errors.send(api, code, kind, msg, code == 503 and { ["Retry-After"] = "1" } or nil)
    end
    if sse then
        ngx_print(errors.sse_event(api, kind, msg))
        ngx_flush(true)
    end
end

-- nginx refused the body itself (client_max_body_size): same answer, API-shaped.
function _M.too_large(api)
    return errors.send(api, 413, "request_too_large",
        "request body exceeds the limit of " .. settings.get().max_body .. " bytes")
end

-- Content handler for POST /v1/messages ("anthropic") and /v1/chat/completions ("openai").
function _M.serve(api)
    local s = settings.get()
    local method = ngx.req.get_method()
    if method ~= "POST" then
        return errors.send(api, 405, "invalid_request_error", "method " .. method .. " not allowed; use POST",
            { Allow = "POST" })
    end
    local ct = ngx_var.content_type
    if ct and not is_json(ct) then
        return errors.send(api, 415, "invalid_request_error",
            "content-type " .. ct .. " is not supported; send application/json")
    end
    local len = tonumber(ngx_var.content_length)
    if len and len > s.max_body then
        return errors.send(api, 413, "request_too_large",
            "request body of " .. len .. " bytes exceeds the limit of " .. s.max_body .. " bytes")
    end

    local state = { aborted = false }
    ngx.on_abort(function() state.aborted = true end)

    local body, code, kind, msg = read_body(s.max_body)
    if not body then
        return errors.send(api, code, kind, msg)
    end
    local flags = cache_flags()
    if api == "openai" then
        flags = flags + abi.C.ZCCP_FLAG_API_OPENAI
    end
    local deadline = ngx_now() + s.request_timeout_ms / 1000
    local fp = fingerprint.compute(api, body)

    for _ = 1, MAX_ATTEMPTS do
        local a, err = arena_mod.acquire()
        if not a then
            return errors.send(api, 503, "overloaded_error", "engine unavailable: " .. err, { ["Retry-After"] = "1" })
        end
        if #body > a.payload_cap then
            a:release()
            return errors.send(api, 413, "request_too_large",
                "request body of " .. #body .. " bytes exceeds the slot capacity of " .. a.payload_cap .. " bytes")
        end
        local ok, res = pcall(attempt, api, a, body, flags, deadline, state, fp)
        if not ok then
            -- A bug must not leak a slot or a doorbell connection.
            ngx_log(ngx_ERR, "zccp: request failed: ", res)
            if state.bell then
                state.bell:close()
                state.bell = nil
            end
            if state.cleanup then
                state.cleanup()
            end
            a:release()
            if not ngx.headers_sent then
                return errors.send(api, 500, "api_error", "internal error in the gateway")
            end
            return
        end
        a:release()
        if res ~= "retry" then
            return res
        end
        arena_mod.refresh()
    end
    return errors.send(api, 503, "overloaded_error", "engine restarted; retry", { ["Retry-After"] = "1" })
end

return _M
