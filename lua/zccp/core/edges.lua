-- The answers beside zccp.handler.serve: nginx's own refusals (413, 429, 400, 431, ...), the catch-all
-- 404, POST /v1/zccp/l1/purge, and the models path check.
local errors = require "zccp.errors"
local settings = require "zccp.settings"
local admin_gate = require "zccp.admin.gate"
local hooks = require("zccp.core.pipeline").hooks

local ngx = ngx
local ngx_var = ngx.var
local ngx_header = ngx.header
local ngx_print = ngx.print
local str_find = string.find
local str_match = string.match
local tonumber = tonumber

local _M = { _VERSION = "0.1.0" }

-- nginx refused the body itself (client_max_body_size): same answer, API-shaped.
function _M.too_large(api)
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    return errors.send(api, 413, "request_too_large",
        "request body exceeds the limit of " .. settings.get().max_body .. " bytes")
end

-- What nginx itself answers on ZCCP's locations (error_page ... @zccp_error_<api>), by
-- $status: the error kind and whether a client should come back later (retry-after).
local NGINX_ERRORS = {
    [400] = { "invalid_request_error", "nginx could not read the request" },
    [429] = { "rate_limit_error", "too many requests: refused by this server's request limits", true },
    [500] = { "api_error", "internal error in the gateway" },
    [502] = { "api_error", "bad gateway" },
    [503] = { "overloaded_error", "service unavailable: refused by this server's request limits", true },
    [504] = { "api_error", "gateway timeout" },
}
local RETRY_AFTER_S = "1"

-- error_page's named location: the status nginx meant (a server-level limit_req or
-- limit_conn's 429/503, client_max_body_size's 413, ...) in the API's shape, never its HTML
-- page. api nil: /v1/models, whose shape the anthropic-version header picks.
function _M.nginx_error(api)
    local status = tonumber(ngx_var.status) or 500
    api = api or (ngx_var.http_anthropic_version and "anthropic" or "openai")
    if status == 413 then
        return _M.too_large(api)
    end
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    local e = NGINX_ERRORS[status]
    if not e then
        e = { status < 500 and "invalid_request_error" or "api_error", "HTTP " .. status }
    end
    return errors.send(api, status, e[1], e[2], e[3] and { ["Retry-After"] = RETRY_AFTER_S } or nil)
end

-- What nginx refuses before it picks a location, while it reads the request line and the
-- header lines: no location's error_page sees it, only the server's, redirected to
-- /zccp/request-error (zccp_server.conf; ?status=494 where `=` lets the answer say 431 and
-- nginx's $status is then 0). nginx's code -> the answer's status and message.
local REQUEST_ERRORS = {
    [400] = { 400, "nginx could not read the request's header lines (e.g. a bad Content-Length, "
        .. "or Content-Length with Transfer-Encoding)" },
    [414] = { 414, "request URI too long: the request line must fit in nginx's large_client_header_buffers" },
    [494] = { 431, "request header fields too large: each header line must fit in nginx's "
        .. "large_client_header_buffers" },
    [501] = { 501, "unsupported Transfer-Encoding: only chunked is accepted" },
}

local OPENAI_PATHS = { ["/v1/chat/completions"] = true, ["/v1/completions"] = true, ["/v1/responses"] = true }
local ANTHROPIC_PATHS = { ["/v1/messages"] = true, ["/v1/messages/count_tokens"] = true }

-- The API whose shape a path of ZCCP's answers in (the models paths by the
-- anthropic-version header), or nil for a path that is not ZCCP's.
local function path_api(path)
    if OPENAI_PATHS[path] then
        return "openai"
    end
    if ANTHROPIC_PATHS[path] then
        return "anthropic"
    end
    if path == "/v1/models" or _M.model_id(path) then
        return ngx_var.http_anthropic_version and "anthropic" or "openai"
    end
    return nil
end

-- /zccp/request-error, error_page's target for those refusals ($request_uri: the client's
-- request; empty where nginx could not read its request line). On ZCCP's paths, or any
-- path with ?any=1 (the standalone server: all its paths are ZCCP's, Anthropic's shape
-- elsewhere): the API's shape. On the site's own paths: nginx's own page, as without ZCCP
-- (error_page is not followed twice, so ngx.exit gives nginx's default answer).
function _M.request_error()
    ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
    if not ngx.req.is_internal() then   -- a client's own request for this path
        return _M.not_found()
    end
    local status = tonumber(ngx_var.arg_status) or tonumber(ngx_var.status) or 400
    local e = REQUEST_ERRORS[status]
    local api = path_api(str_match(ngx_var.request_uri or "", "^[^?]*"))
    if not api and ngx_var.arg_any == "1" then
        api = "anthropic"
    end
    if not (e and api) then
        return ngx.exit(status)
    end
    return errors.send(api, e[1], "invalid_request_error", e[2])
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
    local purge = hooks.purge_l1   -- from the l1 plugin; without it L1 is out of the path: nothing kept
    if purge then
        purge()
    end
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
    local id = str_match(uri, "^/v1/models/([A-Za-z0-9._:-]+)$")
    return id
end

-- GET /v1/models (and /v1/models/{id}) (zccp.handler.serve_models): Anthropic's shape when the client says
-- anthropic-version (the Anthropic SDK always does), OpenAI's otherwise.
-- Returns the API to serve it in, or nil once answered 404.
function _M.models_api()
    local api = ngx_var.http_anthropic_version and "anthropic" or "openai"
    local uri = ngx_var.uri
    if uri ~= "/v1/models" and not _M.model_id(uri) then   -- the standalone's prefix location
        ngx_header["X-Request-ID"] = ngx_var.zccp_request_id
        errors.send(api, 404, "not_found_error", "no model path " .. uri .. "; use /v1/models/{id}")
        return nil
    end
    return api
end

return _M
