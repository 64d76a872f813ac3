-- The database store on PostgreSQL. {table} is a validated identifier.

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at DOUBLE PRECISION
)

-- name: add
INSERT INTO {table} AS t (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
WHERE t.expires_at IS NOT NULL AND t.expires_at <= ?

-- name: increment
INSERT INTO {table} AS t (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET
    value = CASE WHEN t.expires_at IS NOT NULL AND t.expires_at <= ?
                 THEN excluded.value
                 ELSE (CAST(t.value AS BIGINT) + ?)::text END,
    expires_at = CASE WHEN t.expires_at IS NOT NULL AND t.expires_at <= ?
                      THEN excluded.expires_at ELSE t.expires_at END
RETURNING value

-- name: put
INSERT INTO {table} AS t (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
