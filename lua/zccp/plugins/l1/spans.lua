-- The spans of L1 hits (nginx answered them alone; docs/observability.md). While the
-- engine exports traces (its control page says so), each sampled L1 hit is one record
-- (struct zccp_l1_span) in this worker's buffer: a few stores, no I/O on the request.
-- A timer sends the buffer to the engine as a ZCCP_KIND_SPANS request through a slot,
-- as any request goes (the engine makes the spans and exports them); a full buffer, or
-- no slot free, drops records (never waited for): counted in
-- zccp_nginx_l1_spans_dropped_total{reason} and the worker's log line.
local ffi = require "ffi"
local abi = require "zccp.lib.abi"
local engines = require "zccp.lib.engines"
local arena_mod = require "zccp.lib.arena"
local transport = require "zccp.core.transport"
local metrics = require "zccp.lib.metrics"

local ngx = ngx
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_now = ngx.now
local ngx_req_start_time = ngx.req.start_time
local ngx_timer_at = ngx.timer.at
local ngx_log = ngx.log
local ngx_WARN = ngx.WARN
local random = math.random
local ffi_copy = ffi.copy
local ffi_fill = ffi.fill
local ffi_string = ffi.string

local _M = {}

local MAX = 256         -- records a batch holds (32 KiB of payload)
local FLUSH_S = 0.2     -- how long a record may wait for its batch
local buf, n, scheduled, dropped = nil, 0, false, 0

-- Sends one batch in a slot of engine e and waits for its answer: true, or nil, message.
local function send(e, data)
    local C = abi.C
    local a, err = arena_mod.acquire(e)
    if not a then
        return nil, err
    end
    if #data > a.payload_cap then
        data = data:sub(1, a.payload_cap - a.payload_cap % C.ZCCP_L1_SPAN_SIZE)
    end
    local slot, _, _, msg = transport.claim_and_fill(a, { body = data, own = true },
        C.ZCCP_FLAG_NO_CACHE + C.ZCCP_FLAG_NO_STORE, nil, { kind = C.ZCCP_KIND_SPANS }, "")
    if not slot then
        a:release()
        return nil, msg
    end
    local ok, rerr = transport.ring(slot, e)
    local done = false
    if ok then
        for _ = 1, 20 do   -- the ring's read timeout each (zccp.core.transport): a few seconds at most
            local notice, nerr = slot.bell:read_notice()
            if notice then
                if notice.final == 1 then
                    done = true
                    break
                end
            elseif nerr ~= "timeout" then
                break
            end
        end
    end
    transport.hang_up(slot, done)
    transport.release(slot)
    a:release()
    if not done then
        return nil, rerr or "no answer"
    end
    return true
end

local function flush(premature)
    scheduled = false
    if premature or n == 0 then
        return
    end
    local data = ffi_string(buf, n * abi.C.ZCCP_L1_SPAN_SIZE)
    local count = n
    n = 0
    local ok, err = send(engines.list()[1], data)
    if not ok then
        dropped = dropped + count
        metrics.l1_spans_dropped("not_sent", count)
        ngx_log(ngx_WARN, "zccp: ", count, " L1 hit spans not sent (", dropped, " in all): ", err)
    end
end

-- At an L1 hit whose answer is written: its record, when traced and sampled.
function _M.note(api)
    local a, ppm = arena_mod.tracing()
    if not a then
        return
    end
    if not buf then
        buf = ffi.new("struct zccp_l1_span[?]", MAX + 1)   -- the last: the sampling's scratch when full
    end
    local full = n >= MAX
    local rec = buf[full and MAX or n]
    ffi_fill(rec, abi.C.ZCCP_L1_SPAN_SIZE)
    if transport.read_traceparent(rec, ngx_var.http_traceparent) then
        if rec.trace_flags % 2 == 0 then   -- the client's unsampled traceparent
            return
        end
    elseif ppm < 1000000 and random() * 1000000 >= ppm then
        return
    end
    if full then   -- a sampled hit's span, dropped
        dropped = dropped + 1
        metrics.l1_spans_dropped("buffer_full", 1)
        return
    end
    local start = ngx_req_start_time()
    local dur = (ngx_now() - start) * 1e6
    rec.start_ns = start * 1e9
    rec.duration_us = dur > 0 and dur or 0
    rec.status = ngx.status
    rec.api = api == "openai" and 1 or 0
    local rid = ngx_header["X-Request-ID"]
    if type(rid) == "string" then
        local len = #rid < abi.C.ZCCP_REQUEST_ID_MAX and #rid or abi.C.ZCCP_REQUEST_ID_MAX
        ffi_copy(rec.request_id, rid, len)
        rec.request_id_len = len
    end
    n = n + 1
    if not scheduled then
        local ok, err = ngx_timer_at(FLUSH_S, flush)
        if not ok then
            ngx_log(ngx_WARN, "zccp: L1 hit spans: no timer: ", err)
            metrics.l1_spans_dropped("not_sent", 1)
            n = n - 1
            return
        end
        scheduled = true
    end
end

return _M
