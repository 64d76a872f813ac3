-- The database store on SQLite, libSQL and D1. {table} is a validated identifier.
-- Values are JSON text; expires_at is epoch seconds (NULL = never).

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    expires_at REAL
)

-- name: add
-- Inserts, or takes over an expired row; 1 affected row = this call added the key.
-- params: key, value, expires_at, now
INSERT INTO {table} (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= ?

-- name: increment
-- params: key, by (as the new value), expires_at, now, by, now
-- CAST(? AS INTEGER): D1's binding passes JS numbers, which SQLite receives as REAL.
INSERT INTO {table} (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET
    value = CASE WHEN {table}.expires_at IS NOT NULL AND {table}.expires_at <= ?
                 THEN excluded.value
                 ELSE CAST(CAST({table}.value AS INTEGER) + CAST(? AS INTEGER) AS TEXT) END,
    expires_at = CASE WHEN {table}.expires_at IS NOT NULL AND {table}.expires_at <= ?
                      THEN excluded.expires_at ELSE {table}.expires_at END
RETURNING value

-- name: put
INSERT INTO {table} (key, value, expires_at) VALUES (?, ?, ?)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
