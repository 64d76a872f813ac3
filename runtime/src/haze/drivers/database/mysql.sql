-- Queue statements for MySQL 8 and MariaDB 10.6+. {jobs} and {failed} are validated
-- identifiers. The tables compare text byte for byte, trailing spaces included: queue
-- names that differ only in case, accents or a trailing space are different queues, as
-- on PostgreSQL and SQLite. That is a binary NO PAD collation, named differently by the
-- two servers (utf8mb4_bin pads): the executable comments pick MariaDB's (/*M! */) or
-- MySQL 8's (/*!80000 */, which MariaDB skips). `haze db:migrate` converts tables
-- created before (haze/database/upgrades.py).

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
    INDEX {jobs}_queue_idx (queue, reserved_at, available_at)
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

-- name: claim_select
-- MySQL has no UPDATE … RETURNING: select the row FOR UPDATE SKIP LOCKED inside a
-- transaction, then mark it with claim_mark.
-- params: queue, now, abandoned_before
SELECT id, payload, attempts FROM {jobs}
WHERE queue = ?
  AND ((reserved_at IS NULL AND available_at <= ?)
       OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?))
ORDER BY id
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: claim_mark
UPDATE {jobs} SET reserved_at = ?, heartbeat_at = ?, attempts = attempts + 1 WHERE id = ?

-- name: claim_many_select
-- claim_select for up to LIMIT rows; claim_many_mark marks them with one token.
-- params: queue, now, abandoned_before, limit
SELECT id, payload, attempts FROM {jobs}
WHERE queue = ?
  AND ((reserved_at IS NULL AND available_at <= ?)
       OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?))
ORDER BY id
LIMIT ?
FOR UPDATE SKIP LOCKED

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
