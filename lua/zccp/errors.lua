-- Errors that nginx answers itself (before the engine sees the body), in the
-- shape of the API the client called. The kinds, their statuses and OpenAI's
-- type/code for each come from zccp.error_kinds, the table the engine's
-- zccp.api.errors reads too. The engine renders all other errors.
local ngx = ngx
local cjson = require "cjson.safe"
local KINDS = require "zccp.error_kinds"

local encode = cjson.encode
local null = cjson.null
local pairs = pairs

local _M = { _VERSION = "0.1.0" }

-- nginx's own refusals (zccp.core.edges): a body over client_max_body_size, header lines
-- over large_client_header_buffers; answered before any body byte is read.
local NO_BODY_READ = { [413] = true, [431] = true }

function _M.body(api, kind, message)
    if api == "openai" then
        local k = KINDS[kind] or KINDS.api_error
        return encode { error = { message = message, type = k.openai_type, param = null, code = k.openai_code or null } }
    end
    return encode { type = "error", error = { type = kind, message = message } }
end

-- Send a complete JSON error response. It does not call ngx.exit, so callers
-- still run their clean-up (slot and arena release) after it.
function _M.send(api, status, kind, message, headers)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    if NO_BODY_READ[status] and not ngx.header["X-ZCCP-Context-ID"] then
        -- no body was read, so there is no content hash: the request id stands in for it
        -- (docs/existing-nginx.md, "Logs"), and the zccp_json log line carries the same
        ngx.header["X-ZCCP-Context-ID"] = ngx.var.zccp_request_id
    end
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
