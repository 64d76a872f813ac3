-- Queue statements for PostgreSQL. {jobs} and {failed} are validated identifiers.

-- name: schema
CREATE TABLE IF NOT EXISTS {jobs} (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reserved_at DOUBLE PRECISION,
    heartbeat_at DOUBLE PRECISION,
    available_at DOUBLE PRECISION NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS {jobs}_queue_idx ON {jobs} (queue, id) WHERE reserved_at IS NULL;
CREATE INDEX IF NOT EXISTS {jobs}_reserved_idx ON {jobs} (queue, reserved_at) WHERE reserved_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {failed} (
    id BIGSERIAL PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    connection TEXT NOT NULL,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    exception TEXT NOT NULL,
    failed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS {failed}_failed_at_idx ON {failed} (failed_at);

-- name: claim
-- SELECT … FOR UPDATE SKIP LOCKED and the marking UPDATE in one statement (one
-- transaction): concurrent workers skip the locked row instead of waiting for it.
-- params: reserved_at, heartbeat_at, queue, now, abandoned_before
WITH next AS (
    SELECT id FROM {jobs}
    WHERE queue = ?
      AND ((reserved_at IS NULL AND available_at <= ?)
           OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?))
    ORDER BY id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} AS j SET reserved_at = ?, heartbeat_at = ?, attempts = j.attempts + 1
FROM next WHERE j.id = next.id
RETURNING j.id, j.payload, j.attempts, j.reserved_at
