-- API keys' Redis layout (docs/keys.md): the ONE table. The admin API (zccp.admin.keys)
-- and the auth plugin require it; the engine's zccp.config.keystore (zccp-keys) reads it with
-- the literal reader. Keep it a literal table (strings and tables only).
return {
    record = "zccp:auth:k:",    -- .. <sha256 hex>: the key's record (JSON); nginx GETs it
    index = "zccp:auth:index",  -- hash: key id -> the record, its hash, revoked_at
    tenant = "zccp:auth:t:",    -- .. <tenant>: the tenant's own limits, JSON {"limits": {...}}
    -- a record's (and a tenant's) limits, each an integer >= 0 (0: no limit)
    limit_names = { "rpm", "itpm", "otpm", "concurrency", "daily_tokens", "monthly_tokens" },
}
