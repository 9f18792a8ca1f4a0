-- Refuses a request whose prompt holds a forbidden word (403, in the request's API), on
-- both APIs and every endpoint: r:prompt_text() is the text of system, messages (tool
-- results too), prompt, input and instructions, decoded once per request for all plugins.
local pipeline = require "zccp.core.pipeline"

local str_find = string.find
local str_lower = string.lower

local _M = {
    name = "blocklist",
    before = { "l1" },   -- a forbidden prompt is refused before any cached answer is served
    schema = {
        words = { type = "array", items = "string", required = true },   -- matched case-insensitively
        status = { type = "integer", default = 403, enum = { 400, 403 } },
    },
}

-- The prompt's text is needed whole: a large body must not stream past this plugin.
function _M.wants_body()
    return true
end

function _M.prepare(r, conf)
    local text = str_lower(r:prompt_text())
    local words = conf.words
    for i = 1, #words do
        if str_find(text, str_lower(words[i]), 1, true) then
            return pipeline.refuse(r, conf.status, conf.status == 403 and "permission_error"
                or "invalid_request_error", "messages: the prompt holds a blocked word")
        end
    end
end

return _M
