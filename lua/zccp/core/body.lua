-- The request body, two ways. Small bodies are read whole into one Lua string: nginx
-- fingerprints them, so it needs them decoded anyway. Bodies above the fingerprint's
-- decode limit are never needed as a string: over HTTP/1.x they are streamed from the
-- client socket in pieces straight into the claimed slot's payload, which saves building
-- (and hashing, and collecting) one large string per request (bench/analysis.md).
-- HTTP/2 and HTTP/3 have no request socket in nginx's Lua module ("http v2 not supported
-- yet"): there every body is read whole, from nginx's own in-memory body buffer
-- (client_body_buffer_size = client_max_body_size in ZCCP's locations), then copied into
-- the slot; bench/RESULTS.md measures what that costs.
--
--   local body = require "zccp.core.body"
--   local s, status, kind, msg = body.read(cap)              -- whole: string, or nil + error
--   if body.streamable(len, limit) then ...                  -- Content-Length known, not chunked
--   local ok, status, kind, msg = body.receive_into(dst, n, deadline)
local ffi = require "ffi"

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req
local http_version = ngx.req.http_version
local ngx_now = ngx.now
local ffi_copy = ffi.copy
local floor = math.floor
local spawn = ngx.thread.spawn
local wait = ngx.thread.wait
local kill = ngx.thread.kill
local sleep = ngx.sleep
local co_status = coroutine.status

local _M = { _VERSION = "0.1.0" }

local EMPTY = "request body is empty; expected a JSON object"

local function read_body()
    ngx_req.read_body()
    return "read"
end

local function sleep_until(deadline)
    local left = deadline - ngx_now()
    if left > 0 then
        sleep(left)
    end
    return "timeout"
end

-- nginx's body buffer filled by `deadline`: true, or false when the deadline came first
-- (the read still pending: the caller answers 408 and ends the request with ngx.exit,
-- which stops it). nginx's own limit (client_body_timeout) is per read, not overall, and
-- ends the request without an answer. A body that came with the headers (the usual case)
-- finishes within spawn: one coroutine, no timer.
local function read_by(deadline)
    local reader = spawn(read_body)
    if co_status(reader) == "dead" then
        wait(reader)
        return true
    end
    local timer = spawn(sleep_until, deadline)
    local _, what = wait(reader, timer)
    if what == "read" then
        kill(timer)
        return true
    end
    return false
end

-- The whole body as a string, or nil, status, kind, message. deadline (ngx.now() seconds):
-- an upload still unfinished then is answered 408 (see read_by).
function _M.read(cap, deadline)
    if deadline then
        if not read_by(deadline) then
            return nil, 408, "invalid_request_error", "request body not received in time"
        end
    else
        ngx_req.read_body()
    end
    local body = ngx_req.get_body_data()
    if not body then
        if ngx_req.get_body_file() then
            return nil, 413, "request_too_large", "request body exceeds the in-memory body buffer"
        end
        return nil, 400, "invalid_request_error", EMPTY
    end
    local n = #body
    if n == 0 then
        return nil, 400, "invalid_request_error", EMPTY
    end
    if n > cap then
        return nil, 413, "request_too_large", "request body of " .. n .. " bytes exceeds " .. cap .. " bytes"
    end
    return body
end

-- Whether this request's body can be read from the request socket: HTTP/1.x only.
local function has_request_socket()
    local v = http_version()
    return v ~= nil and v < 2
end

-- Whether the body of Content-Length `len` goes straight into the slot: above `limit`
-- (nginx would not fingerprint it), not chunked (the request socket does not de-chunk,
-- and a chunked body has no length to claim a slot for), and over HTTP/1.x.
function _M.streamable(len, limit)
    return len ~= nil and len > limit and ngx_var.http_transfer_encoding == nil and has_request_socket()
end

-- Reads exactly n body bytes into dst (a uint8_t *) by `deadline` (ngx.now() seconds):
-- a slow upload cannot hold the slot past it. true, or nil, status, kind, message;
-- status nil when the client went away (nobody to answer).
function _M.receive_into(dst, n, deadline)
    local sock, err = ngx_req.socket()
    if not sock then
        return nil, 400, "invalid_request_error", "cannot read the request body: " .. (err or "?")
    end
    local off = 0
    while off < n do
        local left_ms = floor((deadline - ngx_now()) * 1000)
        local data, rerr
        if left_ms > 0 then
            sock:settimeout(left_ms)
            data, rerr = sock:receiveany(n - off)
        else
            rerr = "timeout"
        end
        if not data then
            if rerr == "timeout" then
                return nil, 408, "invalid_request_error", "request body not received in time (" .. off
                    .. " of " .. n .. " bytes)"
            end
            return nil, nil, nil, "client closed the connection during the body (" .. (rerr or "?") .. ")"
        end
        local k = #data
        ffi_copy(dst + off, data, k)
        off = off + k
    end
    return true
end

return _M
