local _M = { name = "noop" }
function _M.prepare() end
return _M
