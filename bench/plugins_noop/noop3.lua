local _M = { name = "noop3" }
function _M.prepare() end
return _M
