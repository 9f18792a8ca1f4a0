-- Relays one engine answer from a slot's response ring to the client: waits for the
-- doorbell's notices, sends the status and headers on the first one, copies every
-- committed byte out of the ring (acking it, so the engine can reuse the room) and
-- flushes SSE event by event. Every length read from the slot or the notice is checked
-- before it is used: shared memory is input.
local ffi = require "ffi"
local bit = require "bit"
local abi = require "zccp.lib.abi"
local settings = require "zccp.settings"
local limits_mark = require "zccp.core.committed_mark"
local client_gone = require("zccp.core.client_gone").gone

local ngx = ngx
local ngx_header = ngx.header
local ngx_print = ngx.print
local ngx_flush = ngx.flush
local ngx_now = ngx.now
local ffi_string = ffi.string
local str_format = string.format
local tonumber = tonumber
local tostring = tostring

local _M = { _VERSION = "0.1.0" }

local CLIENT_CHECK_S = 0.25   -- how often a waiting relay asks whether its client is still there

local CACHE_NAMES = { [1] = "HIT", [2] = "NEAR", [3] = "MISS", [4] = "BYPASS", [5] = "ERROR" }
-- The engine's "come back later" answers (its model queue is full): like nginx's own.
local RETRY_STATUSES = { [429] = true, [503] = true, [529] = true }
local REASON_NAMES   -- enum zccp_cache_reason -> X-ZCCP-Cache-Reason (built when the ABI is loaded)

local function reason_names()
    local C = abi.C
    REASON_NAMES = { [tonumber(C.ZCCP_REASON_MASKED_LITERAL)] = "masked_literal",
                     [tonumber(C.ZCCP_REASON_SAMPLED)] = "sampled" }
    return REASON_NAMES
end

local function send_headers(slot, status, sse)
    local meta = slot.arena:meta(slot.index)
    ngx.status = status
    ngx_header["X-ZCCP-Context-ID"] = slot.ctx_hex
    if RETRY_STATUSES[status] then
        local after = tonumber(meta.retry_after_s)   -- the engine's (an upstream's), else 1
        ngx_header["Retry-After"] = after > 0 and after or 1
    end
    local cache = CACHE_NAMES[tonumber(meta.cache_status)]
    if cache then
        ngx_header["X-ZCCP-Cache"] = cache
        slot.cache = cache   -- the verdict sent, metered with the request (r.cache, the relayed phase)
        if cache == "NEAR" then
            ngx_header["X-ZCCP-Similarity"] = str_format("%.4f", tonumber(meta.similarity_ppm) / 1e6)
        end
        if cache == "HIT" or cache == "NEAR" then
            ngx_header["Age"] = tonumber(meta.age_s)
            ngx_header["X-ZCCP-Cache-Layer"] = "L2"   -- the engine's (Redis); L1 hits never get here (zccp.plugins.l1.cache)
        end
        local reason = (REASON_NAMES or reason_names())[tonumber(meta.cache_reason)]
        if reason then
            ngx_header["X-ZCCP-Cache-Reason"] = reason
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

-- Committed-but-unread bytes [from, to) of the response ring, as a string.
local function take(a, i, from, to)
    local cap = a.response_cap
    local base = a:response_ptr(i)
    local pos = from % cap
    local n = to - from
    local first = cap - pos
    if n <= first then
        local s = ffi_string(base + pos, n)
        return s
    end
    return ffi_string(base + pos, first) .. ffi_string(base, n - first)
end

-- Sends an SSE chunk and waits until the client has it. The wait is bounded by the
-- location's send_timeout (limits.stream_stall_timeout_ms): a client that reads nothing
-- for that long is "stalled" and its stream ends; it never holds a relay (and its slot)
-- for longer. The wait yields: the worker's other requests go on meanwhile.
local function send_sse(r, chunk)
    ngx_print(chunk)
    local ok, ferr = ngx_flush(true)
    -- "buffering": an HTTP/1.0 client under lua_http10_buffering, not a lost client
    if not ok and ferr ~= "buffering" then
        if ferr == "timeout" then
            r.stalled = true
        else
            r.state.aborted = true
        end
    end
end

-- One notice: validates it, sends the headers on the first one, relays the new bytes.
-- Returns nil while the answer goes on, else the outcome: "done", "retry" (the engine
-- rejected a stale ring), "stream_bytes" (limits.stream_max_bytes_kb) or an error
-- description.
local function on_notice(slot, r, n)
    local C = abi.C
    local a, i, h = slot.arena, slot.index, slot.header
    if n.slot ~= i or n.generation ~= slot.generation then
        return "doorbell protocol error: notice for another slot"
    end
    if h.generation ~= slot.generation then
        return "slot lost"   -- never written again: it is another request's now
    end
    if n.op == C.ZCCP_OP_REJECT then
        return n.status == 409 and "retry" or ("engine rejected the ring: " .. tonumber(n.status))
    end
    if n.op ~= C.ZCCP_OP_NOTICE then
        return "doorbell protocol error: opcode " .. tonumber(n.op)
    end
    if not r.started then
        local status = tonumber(n.status)
        if status < 100 or status > 599 then
            return "engine sent an invalid status " .. status
        end
        r.sse = bit.band(h.flags, C.ZCCP_FLAG_RESPONSE_SSE) ~= 0
        r.status = status
        send_headers(slot, status, r.sse)
        r.started = true
    end
    -- Committed length from the notice, cross-checked with the header.
    local committed, now_len = tonumber(n.response_len), tonumber(h.response_len)
    if committed > now_len or committed - r.acked > a.response_cap then
        return "engine committed an invalid response length"
    end
    -- The engine's mark (zccp_abi.h committed_mark): relayed up to it, the bytes sent carry
    -- a known output-token count (res.sent_tokens: what a stream ended early is settled on).
    local at, tokens = limits_mark.read(a:meta(i))
    if at > committed and at <= now_len and at - r.acked <= a.response_cap then
        committed = at   -- a later notice's bytes, relayed now
    end
    if r.sse and r.max_bytes > 0 and committed > r.max_bytes then
        return "stream_bytes"
    end
    if committed > r.acked then
        local chunk = take(a, i, r.acked, committed)
        r.acked = committed
        h.response_acked = committed
        if r.sse then
            send_sse(r, chunk)
            if at == committed and not r.stalled and not r.state.aborted then
                r.sent_tokens = tokens
            end
            if r.keep then   -- zccp.plugins.l1.cache may keep this answer: its bytes, up to r.keep of them
                if committed > r.keep then
                    r.keep, r.parts, r.np = nil, {}, 0
                else
                    r.np = r.np + 1
                    r.parts[r.np] = chunk
                end
            end
        else
            r.np = r.np + 1
            r.parts[r.np] = chunk
        end
    end
    if n.final == 1 then
        return "done"
    end
end

-- Why the relay stops here although the engine goes on, or nil: the client, the
-- request's deadline or the stream's duration limit (limits.stream_max_duration_ms).
-- The client is asked every CLIENT_CHECK_S besides its on_abort handler (zccp.core.client_gone).
local function given_up(r, deadline)
    local now = ngx_now()
    if not r.state.aborted and now >= r.check_at then
        r.check_at = now + CLIENT_CHECK_S
        if client_gone() then
            r.state.aborted = true
        end
    end
    if r.state.aborted then
        return "client closed the connection"
    end
    if r.stalled then
        return "stalled"
    end
    if r.sse and r.stream_end and now > r.stream_end then
        return "stream_duration"
    end
    if now > deadline then
        return "timeout"
    end
end

-- Relays the answer to `slot` (rung on slot.bell) until it is complete, the client
-- goes away or stops reading, the deadline or a stream limit passes or the engine fails.
-- state.aborted is set by the request's on_abort handler, or here when the client is
-- found gone (given_up). Returns the outcome ("done",
-- "retry", "timeout", "client closed the connection", "stalled", "stream_duration",
-- "stream_bytes" or an error description) and the relay record
-- { started, status, sse, acked, parts, np, keep }: a complete non-SSE body is in parts,
-- for the caller to send with its Content-Length; an SSE one too while state.keep (a
-- byte count) asks for it and it is no longer (zccp.plugins.l1.cache), else keep is nil.
function _M.run(slot, state, deadline)
    local bell = slot.bell
    local s = settings.get()
    local r = { started = false, sse = false, acked = 0, parts = {}, np = 0, state = state, keep = state.keep,
                stalled = false, max_bytes = s.stream_max_bytes, check_at = ngx_now() + CLIENT_CHECK_S }
    if s.stream_max_duration_ms > 0 then
        r.stream_end = ngx_now() + s.stream_max_duration_ms / 1000
    end
    while true do
        local n, err = bell:read_notice()
        local outcome
        if n then
            outcome = on_notice(slot, r, n)
        elseif err ~= "timeout" then
            outcome = "engine closed the doorbell: " .. tostring(err)
        end
        outcome = outcome or given_up(r, deadline)
        if outcome then
            return outcome, r
        end
    end
end

return _M
