-- Errors that nginx answers itself (before the engine sees the body), in the
-- shape of the API the client called. The engine renders all other errors.
local ngx = ngx
local cjson = require "cjson.safe"

local encode = cjson.encode
local pairs = pairs

local _M = { _VERSION = "0.1.0" }

-- Anthropic error type -> OpenAI error type/code for the same condition.
local OPENAI = {   -- the same mapping as the engine's (engine/zccp/api/openai.py)
    invalid_request_error = { "invalid_request_error", nil },
    not_found_error = { "invalid_request_error", "model_not_found" },
    request_too_large = { "invalid_request_error", "request_too_large" },
    rate_limit_error = { "requests", "rate_limit_exceeded" },
    overloaded_error = { "server_error", "server_overloaded" },
    api_error = { "server_error", nil },
}

function _M.body(api, kind, message)
    if api == "openai" then
        local m = OPENAI[kind] or OPENAI.api_error
        return encode { error = { message = message, type = m[1], param = cjson.null, code = m[2] or cjson.null } }
    end
    return encode { type = "error", error = { type = kind, message = message } }
end

-- Send a complete JSON error response. It does not call ngx.exit, so callers
-- still run their clean-up (slot and arena release) after it.
function _M.send(api, status, kind, message, headers)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    if headers then
        for k, v in pairs(headers) do
            ngx.header[k] = v
        end
    end
    ngx.print(_M.body(api, kind, message))
end

-- An error after an SSE stream has started: one event in the API's framing.
function _M.sse_event(api, kind, message)
    local body = _M.body(api, kind, message)
    if api == "openai" then
        return "data: " .. body .. "\n\n"
    end
    return "event: error\ndata: " .. body .. "\n\n"
end

return _M
