-- The parsed request, shared by every plugin (methods of r, docs/plugins.md): the decoded
-- body and the prompt's text, each made at most once per request and only when a plugin
-- asks (nil when the body streamed into the slot: a plugin that needs it says so in
-- wants_body). Both APIs, every endpoint: system, messages (text, tool results), prompt,
-- input, instructions.
local cjson = require "cjson.safe"

local decode = cjson.decode
local type = type
local concat = table.concat

local _M = {}

local methods = {}
_M.MT = { __index = methods }

-- The decoded body: a table, or false when the body is not a JSON object; nil when no
-- body was read whole. Decoded once: every plugin gets this same table (never write it).
function methods.body_json(r)
    local doc = r.json_doc
    if doc ~= nil then
        return doc
    end
    local body = r.body
    if not body then
        return nil
    end
    doc = decode(body)
    if type(doc) ~= "table" then
        doc = false
    end
    r.json_doc = doc
    return doc
end

local add_content

-- A content value: a string, or a list of blocks ({type = "text", text}, a tool result's
-- content, OpenAI's {type = "input_text" | "output_text", text}).
local function add_blocks(out, v, depth)
    if type(v) == "string" then
        out[#out + 1] = v
        return
    end
    if type(v) ~= "table" or depth > 4 then
        return
    end
    for i = 1, #v do
        local b = v[i]
        if type(b) == "string" then
            out[#out + 1] = b
        elseif type(b) == "table" then
            if type(b.text) == "string" then
                out[#out + 1] = b.text
            end
            if b.content ~= nil then   -- tool_result blocks; Responses' message items
                add_content(out, b.content, depth + 1)
            end
            if type(b.output) == "string" then   -- Responses' function_call_output
                out[#out + 1] = b.output
            end
        end
    end
end
add_content = add_blocks

-- The prompt's text: every piece of text the client sent, in order, joined by newlines;
-- "" when there is none (or no body was read whole). Built once per request.
function methods.prompt_text(r)
    local text = r.prompt_doc
    if text then
        return text
    end
    local doc = methods.body_json(r)
    local out = {}
    if doc then
        add_blocks(out, doc.system, 0)          -- Anthropic
        add_blocks(out, doc.instructions, 0)    -- Responses
        local msgs = doc.messages
        if type(msgs) == "table" then
            for i = 1, #msgs do
                local m = msgs[i]
                if type(m) == "table" then
                    add_blocks(out, m.content, 0)
                end
            end
        end
        add_blocks(out, doc.prompt, 0)          -- completions
        add_blocks(out, doc.input, 0)           -- Responses (a string or items), count_tokens
    end
    text = concat(out, "\n")
    r.prompt_doc = text
    return text
end

-- The model the request names: the router's pick when it routed, else the body's "model";
-- nil when no body was read whole or it names none.
function methods.model_name(r)
    local m = r.model
    if m then
        return m
    end
    local doc = methods.body_json(r)
    m = doc and type(doc.model) == "string" and doc.model or nil
    return m
end

return _M
