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
    created_at REAL NOT NULL,
    grp TEXT,
    turn REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {jobs}_queue_idx ON {jobs} (queue, reserved_at, available_at);
CREATE INDEX IF NOT EXISTS {jobs}_turn_idx ON {jobs} (queue, reserved_at, turn);
CREATE INDEX IF NOT EXISTS {jobs}_group_idx ON {jobs} (queue, grp, turn) WHERE grp IS NOT NULL;
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
-- rows in turn order (see the package docstring): the due rows whose turn has come (read
-- from the turn index at (queue, NULL) in turn order, up to now), the due rows of groups
-- whose turn lies ahead, and the rows whose lease ran out, merged by turn then id. Every
-- row gets the same reserved_at (one token per claim); a row is still owned by (id,
-- reserved_at).
-- params: reserved_at, heartbeat_at, queue, now, now, limit, queue, now, now, limit,
--         queue, abandoned_before, abandoned_before, limit, limit (see PostgreSQL's
--         claim_many for the bound on reserved_at)
UPDATE {jobs} SET reserved_at = ?, heartbeat_at = ?, attempts = attempts + 1
WHERE id IN (
    SELECT id FROM (
        SELECT id, turn FROM (
            SELECT id, turn FROM {jobs}
            WHERE queue = ? AND reserved_at IS NULL AND turn <= ? AND available_at <= ?
            ORDER BY turn, id LIMIT ?
        )
        UNION ALL
        SELECT id, turn FROM (
            -- INDEXED BY: the planner took the turn index here, which reads every row not
            -- due yet (a delayed backlog) on every claim; the group index holds only
            -- grouped rows
            SELECT id, turn FROM {jobs} INDEXED BY {jobs}_group_idx
            WHERE queue = ? AND reserved_at IS NULL AND turn > ? AND available_at <= ?
              AND grp IS NOT NULL
            ORDER BY turn, id LIMIT ?
        )
        UNION ALL
        SELECT id, turn FROM (
            SELECT id, turn FROM {jobs}
            WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
              AND COALESCE(heartbeat_at, reserved_at) <= ?
            ORDER BY available_at, id LIMIT ?
        )
    )
    ORDER BY turn, id LIMIT ?
)
RETURNING id, payload, attempts, reserved_at, turn

-- name: ack_many
-- The driver appends one "(?, ?)" per (id, reserved_at) pair after VALUES; RETURNING
-- names the rows that were still owned.
-- The id IN (...) is what reaches the rows by primary key: SQLite scans the whole table
-- for a row value IN a list of more than one pair.
WITH owned(id, reserved_at) AS (VALUES {{pairs}})
DELETE FROM {jobs} WHERE id IN (SELECT id FROM owned)
  AND (id, reserved_at) IN (SELECT id, reserved_at FROM owned)
RETURNING id

-- name: heartbeat_pairs
-- Renew the leases of running rows of any number of claims (see PostgreSQL's): the
-- driver appends one "(?, ?)" per (id, reserved_at) pair after VALUES; heartbeat_at is
-- the last parameter. The id IN (...) reaches the rows by primary key (see ack_many).
WITH owned(id, reserved_at) AS (VALUES {{pairs}})
UPDATE {jobs} SET heartbeat_at = ? WHERE id IN (SELECT id FROM owned)
  AND (id, reserved_at) IN (SELECT id, reserved_at FROM owned)

-- name: needs_groups
-- One row when the jobs table exists without the group columns (created before tenant
-- groups): `haze db:migrate` then runs upgrade_groups.
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{jobs}'
  AND NOT EXISTS (SELECT 1 FROM pragma_table_info('{jobs}') WHERE name = 'turn')

-- name: upgrade_groups
-- One transaction: the columns, every row's turn (its due time: the order it had), the
-- indexes. A crash leaves the table as it was; the next db:migrate runs it again.
ALTER TABLE {jobs} ADD COLUMN grp TEXT;
ALTER TABLE {jobs} ADD COLUMN turn REAL NOT NULL DEFAULT 0;
UPDATE {jobs} SET turn = available_at;
CREATE INDEX IF NOT EXISTS {jobs}_turn_idx ON {jobs} (queue, reserved_at, turn);
CREATE INDEX IF NOT EXISTS {jobs}_group_idx ON {jobs} (queue, grp, turn) WHERE grp IS NOT NULL
