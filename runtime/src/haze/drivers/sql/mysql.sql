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

-- name: claim_many_select
-- MySQL has no UPDATE … RETURNING: lock up to LIMIT rows FOR UPDATE SKIP LOCKED inside a
-- transaction, then mark them with claim_many_mark (one token). Due order: the ready
-- rows (read from the queue index at (queue, NULL) in available_at, id order, so rows
-- not due yet are never scanned) merged with the rows whose lease ran out, by
-- available_at then id (FIFO among equally due rows).
-- params: queue, now, limit, queue, abandoned_before, abandoned_before, limit, limit
-- (see PostgreSQL's claim_many for the bound on reserved_at)
(SELECT id, payload, attempts, available_at FROM {jobs}
 WHERE queue = ? AND reserved_at IS NULL AND available_at <= ?
 ORDER BY available_at, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED)
UNION ALL
(SELECT id, payload, attempts, available_at FROM {jobs}
 WHERE queue = ? AND reserved_at IS NOT NULL AND reserved_at <= ?
      AND COALESCE(heartbeat_at, reserved_at) <= ?
 ORDER BY available_at, id
 LIMIT ?
 FOR UPDATE SKIP LOCKED)
ORDER BY available_at, id
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
