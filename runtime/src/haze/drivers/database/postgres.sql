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
) WITH (
    -- A queue table holds few live rows and makes three dead ones per job: vacuum it
    -- after a fixed number of them, unthrottled, or it and its indexes keep growing.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000
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

-- name: claim_many
-- claim, for up to LIMIT rows at once: a worker with free slots fills them with one
-- statement. Every row gets the same reserved_at (one token per claim); a row is still
-- owned by (id, reserved_at).
-- params: queue, now, abandoned_before, limit, reserved_at, heartbeat_at
WITH next AS (
    SELECT id FROM {jobs}
    WHERE queue = ?
      AND ((reserved_at IS NULL AND available_at <= ?)
           OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?))
    ORDER BY id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} AS j SET reserved_at = ?, heartbeat_at = ?, attempts = j.attempts + 1
FROM next WHERE j.id = next.id
RETURNING j.id, j.payload, j.attempts, j.reserved_at

-- name: ack_many
-- Delete the rows still owned by these (id, reserved_at) pairs, in one statement and
-- one commit; RETURNING names the ones that were (the others were taken over).
-- params: ids (bigint[]), reserved_ats (double precision[])
DELETE FROM {jobs} AS j
USING unnest(?::bigint[], ?::double precision[]) AS a(id, reserved_at)
WHERE j.id = a.id AND j.reserved_at = a.reserved_at
RETURNING j.id

-- name: autovacuum_off
-- One row when autovacuum will never vacuum the jobs table: off for the whole server,
-- or turned off for the table.
-- params: table name
SELECT current_setting('autovacuum') FROM pg_class
WHERE oid = to_regclass(?)
  AND (current_setting('autovacuum') = 'off'
       OR 'autovacuum_enabled=false' = ANY(COALESCE(reloptions, '{{}}')))

-- name: ack_claim_many
-- ack_many and claim_many in one statement and one commit: a busy worker's buffered acks
-- ride in its next claim instead of costing a round trip and a commit of their own.
-- Result rows with a NULL payload are the acked ids (RETURNING of the DELETE: the rows
-- this claim still owned); the others are the claimed rows. The claim skips the rows
-- being acked: one statement must not both delete and update a row.
-- params: ids (bigint[]), reserved_ats (double precision[]), queue, now,
--         abandoned_before, ids again, limit, reserved_at, heartbeat_at
WITH done AS (
    DELETE FROM {jobs} AS j
    USING unnest(?::bigint[], ?::double precision[]) AS a(id, reserved_at)
    WHERE j.id = a.id AND j.reserved_at = a.reserved_at
    RETURNING j.id
), next AS (
    SELECT id FROM {jobs}
    WHERE queue = ?
      AND ((reserved_at IS NULL AND available_at <= ?)
           OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?))
      AND id <> ALL(?::bigint[])
    ORDER BY id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {jobs} AS j SET reserved_at = ?, heartbeat_at = ?, attempts = j.attempts + 1
    FROM next WHERE j.id = next.id
    RETURNING j.id, j.payload, j.attempts, j.reserved_at
)
SELECT id, NULL::text, NULL::integer, NULL::double precision FROM done
UNION ALL
SELECT id, payload, attempts, reserved_at FROM claimed

-- name: enqueue_notify
-- enqueue with the worker wake-up in the same statement: one round trip, and the
-- NOTIFY goes out when the INSERT commits.
-- params: queue, payload, attempts, available_at, created_at, channel
WITH j AS (
    INSERT INTO {jobs} (queue, payload, attempts, available_at, created_at)
    VALUES (?, ?, ?, ?, ?)
    RETURNING queue
)
SELECT pg_notify(?, j.queue) FROM j
