-- Usage records (zccp.plugins.limits.usage_log, written by zccp.plugins.limits.admit.settle): plugins add their own
-- fields to this request's line with zccp.lib.usage_fields.add (docs/plugins.md).
local usage_fields = require "zccp.lib.usage_fields"

local _M = { name = "usage" }

-- The same helper, for plugins written against this module before it had its own.
_M._field = usage_fields.add

return _M
