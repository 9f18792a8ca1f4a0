-- The error kinds both sides answer with: the ONE table. nginx's zccp.errors requires
-- it; the engine's zccp.api.errors reads it with the literal reader. Keep it a literal
-- table (strings, numbers, tables only).
--
--   kind            the Anthropic error type (the body's error.type on /v1/messages)
--   status          the HTTP status on /v1/messages
--   openai_status   the HTTP status on /v1/chat/completions, when it differs
--   openai_type     error.type in OpenAI's shape
--   openai_code     error.code in OpenAI's shape (absent: null)
return {
    invalid_request_error = { status = 400, openai_type = "invalid_request_error" },
    authentication_error = { status = 401, openai_type = "invalid_request_error", openai_code = "invalid_api_key" },
    permission_error = { status = 403, openai_type = "invalid_request_error", openai_code = "permission_denied" },
    not_found_error = { status = 404, openai_type = "invalid_request_error" },
    request_too_large = { status = 413, openai_type = "invalid_request_error", openai_code = "request_too_large" },
    rate_limit_error = { status = 429, openai_type = "requests", openai_code = "rate_limit_exceeded" },
    api_error = { status = 500, openai_type = "server_error" },
    overloaded_error = { status = 529, openai_status = 503, openai_type = "server_error",
                         openai_code = "server_overloaded" },
}
