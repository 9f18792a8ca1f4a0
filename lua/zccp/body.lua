-- The request body, two ways. Small bodies are read whole into one Lua string: nginx
-- fingerprints them, so it needs them decoded anyway. Bodies above the fingerprint's
-- decode limit are never needed as a string: they are streamed from the client socket
-- in pieces straight into the claimed slot's payload, which saves building (and
-- hashing, and collecting) one large string per request (bench/analysis.md).
--
--   local body = require "zccp.body"
--   local s, status, kind, msg = body.read(cap)              -- whole: string, or nil + error
--   if body.streamable(len, limit) then ...                  -- Content-Length known, not chunked
--   local ok, status, kind, msg = body.receive_into(dst, n, deadline)
local ffi = require "ffi"

local ngx = ngx
local ngx_var = ngx.var
local ngx_req = ngx.req
local ngx_now = ngx.now
local ffi_copy = ffi.copy
local floor = math.floor

local _M = { _VERSION = "0.1.0" }

local EMPTY = "request body is empty; expected a JSON object"

-- The whole body as a string, or nil, status, kind, message.
function _M.read(cap)
    ngx_req.read_body()
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

-- Whether the body of Content-Length `len` goes straight into the slot: above `limit`
-- (nginx would not fingerprint it) and not chunked (the request socket does not de-chunk,
-- and a chunked body has no length to claim a slot for).
function _M.streamable(len, limit)
    return len ~= nil and len > limit and ngx_var.http_transfer_encoding == nil
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
