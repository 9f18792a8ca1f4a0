"""The operator's tools: the stack supervisor (redis, engines, nginx), nginx's rendered includes and
the console scripts (zccp-engine, zccp-nginx, zccp-stack, zccp-cache). No request passes through here."""
