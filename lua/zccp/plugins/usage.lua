-- Usage records (written by the limits plugin in the log phase): plugins add their own
-- fields to a request's line with zccp.lib.usage_fields.add(r, key, value) (docs/plugins.md).
-- The helper lives in lib/, not here: no module outside plugins/ requires a plugin's.
local _M = { name = "usage" }

return _M
