-- Queue statements for SQLite, libSQL/Turso and D1. {jobs} and {failed} are table
-- names from config, validated as identifiers before they are formatted in.

-- name: schema
CREATE TABLE IF NOT EXISTS {jobs} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reserved_at REAL,
    heartbeat_at REAL,
    available_at REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS {jobs}_queue_idx ON {jobs} (queue, reserved_at, available_at);
CREATE TABLE IF NOT EXISTS {failed} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    connection TEXT NOT NULL,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    exception TEXT NOT NULL,
    failed_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS {failed}_failed_at_idx ON {failed} (failed_at);

-- name: claim_many
-- One atomic statement (a write takes the write lock before it reads): claim up to LIMIT
-- rows in due order, the ready rows (read from the queue index at (queue, NULL) in
-- available_at order, so rows not due yet are never scanned) merged with the rows whose
-- lease ran out, by available_at then id (FIFO among equally due rows). Every row gets
-- the same reserved_at (one token per claim); a row is still owned by (id, reserved_at).
-- params: reserved_at, heartbeat_at, queue, now, limit, queue, abandoned_before,
--         abandoned_before, limit, limit (see PostgreSQL's claim_many for the bound)
UPDATE {jobs} SET reserved_at = ?, heartbeat_at = ?, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM (
        SELECT id, available_at FROM (
            SELECT id, available_at FROM {jobs}
            WHERE queue = ? AND reserved_at IS NULL AND available_at <= ?
            ORDER BY available_at, id LIMIT ?
        )
        UNION ALL
        SELECT id, available_at FROM (
            SELECT id, available_at FROM {jobs}
            WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
              AND COALESCE(heartbeat_at, reserved_at) <= ?
            ORDER BY available_at, id LIMIT ?
        )
    )
    ORDER BY available_at, id LIMIT ?
)
RETURNING id, payload, attempts, reserved_at, available_at

-- name: ack_many
-- The driver appends one "(?, ?)" per (id, reserved_at) pair after VALUES; RETURNING
-- names the rows that were still owned.
DELETE FROM {jobs} WHERE (id, reserved_at) IN (VALUES {{pairs}}) RETURNING id
