-- The core's request loop: attempt() claims, fills and rings one engine and relays its
-- answer (zccp.core.transport, zccp.core.relay); attempts() walks the engines the router
-- ranks. The plugin phases filled, headers and relayed run here (zccp.core.pipeline); what
-- the core takes from a plugin (the engines' order, the key's models) comes through the
-- chain's hooks (pipeline.hooks), never by requiring a plugin.
local arena_mod = require "zccp.lib.arena"
local errors = require "zccp.errors"
local relay = require "zccp.core.relay"
local settings = require "zccp.settings"
local metrics = require "zccp.lib.metrics"
local engines = require "zccp.lib.engines"
local sha256 = require "zccp.lib.sha256"
local transport = require "zccp.core.transport"
local pipeline = require "zccp.core.pipeline"

local ngx = ngx
local ngx_print = ngx.print
local ngx_header = ngx.header
local ngx_flush = ngx.flush
local ngx_log = ngx.log
local ngx_ERR = ngx.ERR
local ngx_WARN = ngx.WARN
local ffi_string = require("ffi").string
local mono_s = require("zccp.lib.libc").mono_s
local pcall = pcall
local run = pipeline.run
local DONE = pipeline.DONE
local claim_and_fill, ring, hang_up, release = transport.claim_and_fill, transport.ring, transport.hang_up,
                                               transport.release

local hooks = pipeline.hooks

local _M = { _VERSION = "0.1.0" }

-- Without a plugin that ranks engines (router): the one engine, or every engine in order.
local function own_order()
    return engines.everyone().members, false, false
end
-- An engine that failed: the ranking plugin's to remember (engine_down), else nothing.
local function engine_down(e)
    local down = hooks.engine_down
    if down then
        down(e)
    end
end

local MAX_ATTEMPTS = 2  -- a ring rejected as stale after an engine restart is retried once
local RETRY_AFTER = { ["Retry-After"] = "1" }
local CLIENT_CLOSED = 499   -- nginx's own code for a client that left before its answer
_M.RETRY_AFTER = RETRY_AFTER

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
local function respond(api, slot, outcome, res, r)
    if STREAM_ENDS[outcome] then
        return end_stream(api, slot, outcome)
    end
    if outcome == "done" then
        if not res.sse then
            -- GET /v1/models: the key's models only (hook models_body, from auth)
            local models_body = r.kind == "models" and hooks.models_body
            local body = models_body and models_body(r, res.parts) or nil
            ngx_header["Content-Length"] = body and #body or res.acked
            ngx_print(body or res.parts)
        end
        return
    end
    if outcome == "retry" and not res.started then
        return "retry"
    end
    if outcome == "client closed the connection" then
        if not ngx.headers_sent then
            -- nginx's "client closed request" in the access log and the status metrics, not
            -- the 200 an unset status would say (what goes out goes to nobody)
            ngx.status = CLIENT_CLOSED
        end
        return
    end
    ngx_log(outcome == "timeout" and ngx_WARN or ngx_ERR, "zccp: request ", slot.request_id, " (context ",
            slot.ctx_hex, ") on slot ", slot.index, ": ", outcome)
    local code, kind, msg
    if outcome == "timeout" then
        code, kind, msg = 504, "api_error", "request timed out after " .. settings.get().request_timeout_ms .. " ms"
    else
        code, kind, msg = 503, "overloaded_error", "engine failed: " .. outcome
    end
    if not res.started then
        return errors.send(api, code, kind, msg, code == 503 and RETRY_AFTER or nil)
    end
    if res.sse then
        ngx_print(errors.sse_event(api, kind, msg))
        ngx_flush(true)
    end
end

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
    if run("filled", r, slot) == DONE then   -- e.g. L1 by the digest of a streamed body
        release(slot)
        state.slot = nil
        return
    end
    -- before the ring: a plugin that raises here ends the request before the engine
    -- generates anything (its 500 is the answer; nothing is relayed after it)
    if run("headers", r, e) == DONE then
        release(slot)
        state.slot = nil
        return
    end
    local t_ring = mono_s()
    if r.t0 then
        metrics.phase(api, "admit", t_ring - r.t0)
    end
    local ok, rerr = ring(slot, e)
    if not ok then
        hang_up(slot, false)
        release(slot)
        state.slot = nil
        engine_down(e)
        return "next", 503, "overloaded_error", rerr
    end
    local outcome, res = relay.run(slot, state, r.deadline)
    metrics.phase(api, "engine", mono_s() - t_ring)
    -- the engine's counts and the answer: settlement, L1 (a raise here is logged, the answer stands)
    r.cache = slot.cache   -- the verdict the relay sent (X-ZCCP-Cache)
    run("relayed", r, a:meta(slot.index), outcome, res)
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
        engine_down(e)
        return "next", 503, "overloaded_error", "engine failed: " .. outcome
    end
    return respond(api, slot, outcome, res, r)
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

-- Step 3: attempt() against the engines the router ranks (zccp.plugins.router.route; the one engine
-- without engines:), once more on a stale ring (an engine restarted before anything was
-- sent); an engine that cannot take the request hands it to the next one. Answers the
-- last refusal when none could.
function _M.attempts(r, state)
    local api = r.api
    local order, spilled, failed_over = (hooks.order or own_order)(r)
    local code, kind, msg = 503, "overloaded_error", "engine restarted; retry"
    local passed_busy, passed_failed = false, false   -- what the engines ranked above the one that takes it did
    for k = 1, #order do
        local e = order[k]
        for _ = 1, MAX_ATTEMPTS do
            local a, err = arena_mod.acquire(e)
            if not a then
                engine_down(e)
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
    local src = r.src
    local body = src and src.body
    if body then   -- the context id an engine would have given it, for zccp_json and the client
        local d = src.digest or transport.trace_id(src, r.flags) or sha256.digest(body, #body)
        if d then
            ngx_header["X-ZCCP-Context-ID"] = sha256.hex(d, 8)
        end
    end
    return errors.send(api, code, kind, msg, RETRY_AFTER)
end

-- The bytes now in the slot's digest (for the filled phase; read through the core).
function _M.slot_digest(slot)
    local d = ffi_string(slot.header.sha256, 32)
    return d
end

return _M
