-- Usage records (written by the limits plugin in the log phase): plugins add their own
-- fields to a request's line with zccp.lib.usage_fields.add(r, key, value) (docs/plugins.md).
local usage_fields = require "zccp.lib.usage_fields"

local _M = { name = "usage" }

-- The same helper, for plugins written against this module before it had its own.
_M._field = usage_fields.add

return _M
