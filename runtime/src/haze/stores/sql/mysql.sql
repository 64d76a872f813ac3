-- The database store on MySQL 8 / MariaDB. {table} is a validated identifier.
-- `key` is quoted: it is a reserved word in MySQL. Keys compare byte for byte, trailing
-- spaces included (a binary NO PAD collation, see drivers/sql/mysql.sql: Alice and
-- alice are two keys); the store hashes keys longer than 128 characters to 129
-- (database.py), so a key always fits VARCHAR(191) whole.

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    `key` VARCHAR(191) NOT NULL PRIMARY KEY,
    value LONGTEXT NOT NULL,
    expires_at DOUBLE NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
  /*M! COLLATE=utf8mb4_nopad_bin */ /*!80000 COLLATE=utf8mb4_0900_bin */

-- name: add_insert
-- A plain INSERT, never INSERT IGNORE (which turns every error, a value too long
-- included, into a warning): the store catches the duplicate-key error alone.
INSERT INTO {table} (`key`, value, expires_at) VALUES (?, ?, ?)

-- name: add_takeover
-- The key exists: take it over only when it has expired (atomic single-row UPDATE).
UPDATE {table} SET value = ?, expires_at = ?
WHERE `key` = ? AND expires_at IS NOT NULL AND expires_at <= ?

-- name: increment
-- In a transaction with increment_read: the upsert locks the row until commit.
-- params: key, by, expires_at, now, by, now
INSERT INTO {table} (`key`, value, expires_at) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE
    value = IF(expires_at IS NOT NULL AND expires_at <= ?, VALUES(value),
               CAST(CAST(value AS SIGNED) + ? AS CHAR)),
    expires_at = IF(expires_at IS NOT NULL AND expires_at <= ?, VALUES(expires_at), expires_at)

-- name: increment_read
SELECT value FROM {table} WHERE `key` = ?

-- name: put
INSERT INTO {table} (`key`, value, expires_at) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE value = VALUES(value), expires_at = VALUES(expires_at)
