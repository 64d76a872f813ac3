-- Queue statements for MySQL 8 and MariaDB 10.6+. {jobs} and {failed} are validated
-- identifiers.

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
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS {failed} (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    uuid VARCHAR(64) NOT NULL UNIQUE,
    connection VARCHAR(191) NOT NULL,
    queue VARCHAR(255) NOT NULL,
    payload LONGTEXT NOT NULL,
    exception LONGTEXT NOT NULL,
    failed_at DOUBLE NOT NULL,
    INDEX {failed}_failed_at_idx (failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

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
