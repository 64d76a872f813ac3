-- Queue statements for MySQL 8 and MariaDB 10.6+. {jobs} and {failed} are validated
-- identifiers. The tables compare text byte for byte, trailing spaces included: queue
-- names that differ only in case, accents or a trailing space are different queues, as
-- on PostgreSQL and SQLite. That is a binary NO PAD collation, named differently by the
-- two servers (utf8mb4_bin pads): the executable comments pick MariaDB's (/*M! */) or
-- MySQL 8's (/*!80000 */, which MariaDB skips). `haze db:migrate` converts tables
-- created before (haze/connectors/upgrades.py).

-- name: schema
CREATE TABLE IF NOT EXISTS {jobs} (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue VARCHAR(255) NOT NULL,
    payload LONGTEXT NOT NULL,
    attempts INT UNSIGNED NOT NULL DEFAULT 0,
    reserved_at DOUBLE NULL,
    heartbeat_at DOUBLE NULL,
    available_at DOUBLE NOT NULL,
    created_at DOUBLE NOT NULL,
    grp VARCHAR(128) NULL,
    turn DOUBLE NOT NULL DEFAULT 0,
    INDEX {jobs}_queue_idx (queue, reserved_at, available_at),
    INDEX {jobs}_turn_idx (queue, reserved_at, turn),
    INDEX {jobs}_group_idx (queue, grp, turn)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
  /*M! COLLATE=utf8mb4_nopad_bin */ /*!80000 COLLATE=utf8mb4_0900_bin */;
CREATE TABLE IF NOT EXISTS {failed} (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    uuid VARCHAR(64) NOT NULL UNIQUE,
    connection VARCHAR(191) NOT NULL,
    queue VARCHAR(255) NOT NULL,
    payload LONGTEXT NOT NULL,
    exception LONGTEXT NOT NULL,
    failed_at DOUBLE NOT NULL,
    INDEX {failed}_failed_at_idx (failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
  /*M! COLLATE=utf8mb4_nopad_bin */ /*!80000 COLLATE=utf8mb4_0900_bin */;

-- name: claim_many_select
-- MySQL has no UPDATE … RETURNING: lock up to LIMIT rows FOR UPDATE SKIP LOCKED inside a
-- transaction, then mark them with claim_many_mark (one token). Turn order (see the
-- package docstring): the due rows whose turn has come (read from the turn index at
-- (queue, NULL) in turn order, up to now), the due rows of groups whose turn lies ahead,
-- and the rows whose lease ran out, merged by turn then id.
-- params: queue, now, now, limit, queue, now, now, limit, queue, abandoned_before,
--         abandoned_before, limit, limit (see PostgreSQL's claim_many for the bound on
--         reserved_at)
(SELECT id, payload, attempts, turn FROM {jobs}
 WHERE queue = ? AND reserved_at IS NULL AND turn <= ? AND available_at <= ?
 ORDER BY turn, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT id, payload, attempts, turn FROM {jobs}
 WHERE queue = ? AND reserved_at IS NULL AND turn > ? AND available_at <= ?
   AND grp IS NOT NULL
 ORDER BY turn, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT id, payload, attempts, turn FROM {jobs}
 WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
      AND COALESCE(heartbeat_at, reserved_at) <= ?
 ORDER BY available_at, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED)
ORDER BY turn, id
LIMIT ?

-- name: claim_many_mark
-- The driver fills the id list with one "?" per selected id.
UPDATE {jobs} SET reserved_at = ?, heartbeat_at = ?, attempts = attempts + 1
WHERE id IN ({{ids}})

-- name: ack_many_select
-- MySQL has no DELETE … RETURNING: lock the rows still owned by their (id,
-- reserved_at) first, then delete them by id (ack_many_delete), in one transaction.
-- The driver fills the condition: (reserved_at = ? AND id IN (?, …)) OR …, one group
-- per claim token.
SELECT id FROM {jobs} WHERE {{where}} FOR UPDATE

-- name: ack_many_delete
DELETE FROM {jobs} WHERE id IN ({{ids}})

-- name: heartbeat_pairs
-- Renew the leases of running rows of any number of claims (see PostgreSQL's). The
-- driver fills every id of the chunk (the primary key range the statement reads), then
-- the condition: (reserved_at = ? AND id IN (?, …)) OR …, one group per claim token,
-- compared by the server as the ack does. params: heartbeat_at, id…, then the groups'
UPDATE {jobs} SET heartbeat_at = ? WHERE id IN ({{ids}}) AND ({{where}})

-- name: needs_groups
-- One row when the jobs table exists without the group columns (created before tenant
-- groups): `haze db:migrate` then runs upgrade_groups.
SELECT 1 FROM information_schema.TABLES t
WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = '{jobs}' AND NOT EXISTS (
    SELECT 1 FROM information_schema.COLUMNS c
    WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = '{jobs}' AND c.COLUMN_NAME = 'turn'
)

-- name: upgrade_groups
-- ONE ALTER (applied whole or not at all), then every row's turn: its due time, the
-- order it had. The group column takes the table's binary collation: `Tenant` and
-- `tenant` are two groups. A crash between the two leaves old rows at turn 0: they are
-- claimed first, as the oldest rows would be anyway.
ALTER TABLE {jobs}
    ADD COLUMN grp VARCHAR(128) NULL
        /*M! COLLATE utf8mb4_nopad_bin */ /*!80000 COLLATE utf8mb4_0900_bin */,
    ADD COLUMN turn DOUBLE NOT NULL DEFAULT 0,
    ADD INDEX {jobs}_turn_idx (queue, reserved_at, turn),
    ADD INDEX {jobs}_group_idx (queue, grp, turn);
UPDATE {jobs} SET turn = available_at
