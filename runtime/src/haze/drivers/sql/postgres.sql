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
    created_at DOUBLE PRECISION NOT NULL,
    grp TEXT,
    turn DOUBLE PRECISION NOT NULL DEFAULT 0
) WITH (
    -- A queue table holds few live rows and makes three dead ones per job: vacuum it
    -- after a fixed number of them, unthrottled, or it and its indexes keep growing.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000
);
CREATE INDEX IF NOT EXISTS {jobs}_due_idx ON {jobs} (queue, available_at, id) WHERE reserved_at IS NULL;
CREATE INDEX IF NOT EXISTS {jobs}_reserved_idx ON {jobs} (queue, reserved_at) WHERE reserved_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {jobs}_turn_idx ON {jobs} (queue, turn, id) WHERE reserved_at IS NULL;
CREATE INDEX IF NOT EXISTS {jobs}_group_turn_idx ON {jobs} (queue, turn, id) WHERE reserved_at IS NULL AND grp IS NOT NULL;
CREATE INDEX IF NOT EXISTS {jobs}_group_idx ON {jobs} (queue, grp, turn) WHERE grp IS NOT NULL;
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

-- name: claim_many
-- Claim up to LIMIT rows in turn order (see the package docstring: a row without a group
-- has its due time as its turn, so those are claimed in due order): the due rows whose
-- turn has come (the turn index starts at them and stops at the first turn after now),
-- the due rows of groups whose turn lies ahead (a group's backlog takes one turn a row),
-- and the rows whose lease ran out (their worker died), merged by turn then id. FOR
-- UPDATE SKIP LOCKED: concurrent workers skip a locked row instead of waiting for it.
-- Every row gets the same reserved_at (one token per claim); a row is still owned by
-- (id, reserved_at).
-- The lapsed branch reads the reserved index only up to reserved_at <= abandoned_before
-- (a lease never ends before its claim: heartbeat_at >= reserved_at): every finished
-- job leaves a dead entry there until VACUUM, and a branch that read them all would
-- cost more with every job done. The driver passes 0 (an empty range) between its
-- looks for lapsed rows, so a long backlog's old dead entries are not read per claim.
-- params: queue, now, now, limit, queue, now, now, limit, queue, abandoned_before,
--         abandoned_before, limit, limit, reserved_at, heartbeat_at
WITH due AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NULL AND turn <= ? AND available_at <= ?
    ORDER BY turn, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), ahead AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NULL AND grp IS NOT NULL AND turn > ?
      AND available_at <= ?
    ORDER BY turn, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), lapsed AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
      AND COALESCE(heartbeat_at, reserved_at) <= ?
    ORDER BY available_at, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), next AS (
    SELECT id, turn FROM due
    UNION ALL
    SELECT id, turn FROM ahead
    UNION ALL
    SELECT id, turn FROM lapsed
    ORDER BY turn, id
    LIMIT ?
)
UPDATE {jobs} AS j SET reserved_at = ?, heartbeat_at = ?, attempts = j.attempts + 1
FROM next WHERE j.id = next.id
RETURNING j.id, j.payload, j.attempts, j.reserved_at, j.turn

-- name: ack_many
-- Delete the rows still owned by these (id, reserved_at) pairs, in one statement and
-- one commit; RETURNING names the ones that were (the others were taken over).
-- params: ids (bigint[]), reserved_ats (double precision[])
DELETE FROM {jobs} AS j
USING unnest(?::bigint[], ?::double precision[]) AS a(id, reserved_at)
WHERE j.id = a.id AND j.reserved_at = a.reserved_at
RETURNING j.id

-- name: heartbeat_pairs
-- Renew the leases of running rows of any number of claims in one statement: a worker
-- that claimed its jobs in thousands of small claims holds thousands of tokens, and one
-- statement per token made a round outlast retry_after. params: heartbeat_at, ids
-- (bigint[]), reserved_ats (double precision[])
UPDATE {jobs} AS j SET heartbeat_at = ?
FROM unnest(?::bigint[], ?::double precision[]) AS a(id, reserved_at)
WHERE j.id = a.id AND j.reserved_at = a.reserved_at

-- name: vacuum_due
-- The jobs table's dead rows when autovacuum will never vacuum it (off for the whole
-- server, or for the table); no row when it will.
-- params: table name
SELECT s.n_dead_tup FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.relid = to_regclass(?)
  AND (current_setting('autovacuum') = 'off'
       OR 'autovacuum_enabled=false' = ANY(COALESCE(c.reloptions, '{{}}')))

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
-- being acked (only a lapsed lease can make one look claimable): one statement must not
-- both delete and update a row.
-- params: ids (bigint[]), reserved_ats (double precision[]), then claim_many's, with
--         the ids again after abandoned_before
WITH done AS (
    DELETE FROM {jobs} AS j
    USING unnest(?::bigint[], ?::double precision[]) AS a(id, reserved_at)
    WHERE j.id = a.id AND j.reserved_at = a.reserved_at
    RETURNING j.id
), due AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NULL AND turn <= ? AND available_at <= ?
    ORDER BY turn, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), ahead AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NULL AND grp IS NOT NULL AND turn > ?
      AND available_at <= ?
    ORDER BY turn, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), lapsed AS (
    SELECT id, turn FROM {jobs}
    WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
      AND COALESCE(heartbeat_at, reserved_at) <= ?
      AND id <> ALL(?::bigint[])
    ORDER BY available_at, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
), next AS (
    SELECT id, turn FROM due
    UNION ALL
    SELECT id, turn FROM ahead
    UNION ALL
    SELECT id, turn FROM lapsed
    ORDER BY turn, id
    LIMIT ?
), claimed AS (
    UPDATE {jobs} AS j SET reserved_at = ?, heartbeat_at = ?, attempts = j.attempts + 1
    FROM next WHERE j.id = next.id
    RETURNING j.id, j.payload, j.attempts, j.reserved_at, j.turn
)
SELECT id, NULL::text, NULL::integer, NULL::double precision, NULL::double precision
FROM done
UNION ALL
SELECT id, payload, attempts, reserved_at, turn FROM claimed

-- name: enqueue_notify
-- enqueue with the worker wake-up in the same statement: one round trip, and the
-- NOTIFY goes out when the INSERT commits.
-- params: queue, payload, attempts, available_at, created_at, grp, turn, channel
WITH j AS (
    INSERT INTO {jobs} (queue, payload, attempts, available_at, created_at, grp, turn)
    VALUES (?, ?, ?, ?, ?, ?, ?)
    RETURNING queue
)
SELECT pg_notify(?, j.queue) FROM j

-- name: needs_due_index
-- One row when the jobs table exists without the due index (created before claims went
-- in due order): `haze db:migrate` then runs upgrade_due_index.
SELECT 1 WHERE to_regclass('{jobs}') IS NOT NULL AND to_regclass('{jobs}_due_idx') IS NULL

-- name: upgrade_due_index
-- The claim reads the due index; the id-ordered index it replaces serves nothing now.
CREATE INDEX IF NOT EXISTS {jobs}_due_idx ON {jobs} (queue, available_at, id) WHERE reserved_at IS NULL;
DROP INDEX IF EXISTS {jobs}_queue_idx

-- name: needs_groups
-- One row when the jobs table exists without the group columns (created before tenant
-- groups): `haze db:migrate` then runs upgrade_groups.
SELECT 1 WHERE to_regclass('{jobs}') IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = to_regclass('{jobs}') AND attname = 'turn' AND NOT attisdropped
)

-- name: upgrade_groups
-- One transaction: the columns, every row's turn (its due time: the order it had), the
-- indexes. A crash leaves the table as it was; the next db:migrate runs it again.
ALTER TABLE {jobs} ADD COLUMN IF NOT EXISTS grp TEXT,
    ADD COLUMN IF NOT EXISTS turn DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE {jobs} SET turn = available_at;
CREATE INDEX IF NOT EXISTS {jobs}_turn_idx ON {jobs} (queue, turn, id) WHERE reserved_at IS NULL;
CREATE INDEX IF NOT EXISTS {jobs}_group_turn_idx ON {jobs} (queue, turn, id) WHERE reserved_at IS NULL AND grp IS NOT NULL;
CREATE INDEX IF NOT EXISTS {jobs}_group_idx ON {jobs} (queue, grp, turn) WHERE grp IS NOT NULL
