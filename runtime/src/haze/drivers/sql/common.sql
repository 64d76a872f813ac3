-- Statements shared by every dialect ({jobs}/{failed}: validated identifiers).

-- name: enqueue
-- params: queue, payload, attempts, available_at, created_at, grp, turn
INSERT INTO {jobs} (queue, payload, attempts, available_at, created_at, grp, turn)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: queue_columns
-- Reads nothing; fails unless the table has the queue's columns from before groups.
SELECT queue, payload, attempts, reserved_at, heartbeat_at, available_at FROM {jobs} WHERE 1 = 0

-- name: group_backlog
-- The groups with the most queued (unclaimed) rows, largest first (the group index).
-- params: queue, limit
SELECT grp, COUNT(*) FROM {jobs}
WHERE queue = ? AND grp IS NOT NULL AND reserved_at IS NULL
GROUP BY grp ORDER BY COUNT(*) DESC, grp LIMIT ?

-- name: group_turn
-- What a new row of a group needs for its turn: the group's last turn, and the turn of
-- the queue's first unclaimed row (a group back from idle starts there, not behind the
-- turns it had). params: queue, grp, queue
SELECT (SELECT MAX(turn) FROM {jobs} WHERE queue = ? AND grp = ?),
       (SELECT MIN(turn) FROM {jobs} WHERE queue = ? AND reserved_at IS NULL)

-- name: ack
-- Only the worker whose claim is still current (its reserved_at) may delete the row.
DELETE FROM {jobs} WHERE id = ? AND reserved_at = ?

-- name: still_there
-- Of the rows an ack did not delete, those still in the table: taken over by another
-- worker. A row that is gone was deleted by an earlier try of this ack (its answer lost)
-- or finished by the worker that took it over: nothing runs it again.
SELECT id FROM {jobs} WHERE id IN ({{ids}})

-- name: retry
-- A row without a group keeps its due time as its turn; a group's row keeps its turn.
-- params: available_at, available_at, id, reserved_at
UPDATE {jobs} SET reserved_at = NULL, heartbeat_at = NULL, available_at = ?,
    turn = CASE WHEN grp IS NULL THEN ? ELSE turn END
WHERE id = ? AND reserved_at = ?

-- name: heartbeat
UPDATE {jobs} SET heartbeat_at = ? WHERE id = ? AND reserved_at = ?

-- name: heartbeat_many
-- The rows of one claim (they share reserved_at); the driver fills one ? per row id.
-- params: heartbeat_at, reserved_at, id…
UPDATE {jobs} SET heartbeat_at = ? WHERE reserved_at = ? AND id IN ({{ids}})

-- name: reserved_of
-- The claim a row is under now. params: id
SELECT reserved_at FROM {jobs} WHERE id = ?

-- name: still_mine
-- Of a claim's rows, those that still carry its reserved_at. params: reserved_at, id…
SELECT id FROM {jobs} WHERE reserved_at = ? AND id IN ({{ids}})

-- name: next_due
-- When the first row of the queue not due yet comes due: an idle worker's wait ends
-- then. The first entry of the index the claim reads (due rows first). params: queue
SELECT MIN(available_at) FROM {jobs} WHERE queue = ? AND reserved_at IS NULL

-- name: size
SELECT COUNT(*) FROM {jobs} WHERE queue = ?

-- name: counts
-- params: now, abandoned_before, now, abandoned_before, now, abandoned_before,
-- lease_seconds, now, queue. A claim whose lease ran out (its worker died) is ready
-- again: the next claim takes it over. The fourth column is when the oldest ready row
-- became ready: its available_at (dispatch, or due after a delay or backoff), or the
-- end of a dead worker's lease; the last, when the next delayed row comes due.
SELECT
    SUM(CASE WHEN (reserved_at IS NULL AND available_at <= ?)
              OR (reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?)
        THEN 1 ELSE 0 END),
    SUM(CASE WHEN reserved_at IS NULL AND available_at > ? THEN 1 ELSE 0 END),
    SUM(CASE WHEN reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) > ?
        THEN 1 ELSE 0 END),
    MIN(CASE WHEN reserved_at IS NULL AND available_at <= ? THEN available_at
             WHEN reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) <= ?
             THEN COALESCE(heartbeat_at, reserved_at) + ? END),
    MIN(CASE WHEN reserved_at IS NULL AND available_at > ? THEN available_at END)
FROM {jobs} WHERE queue = ?

-- name: running
-- params: queue, abandoned_before, limit
SELECT payload, attempts, reserved_at FROM {jobs}
WHERE queue = ? AND reserved_at IS NOT NULL AND COALESCE(heartbeat_at, reserved_at) > ?
ORDER BY reserved_at LIMIT ?

-- name: find_job
-- params: a LIKE pattern for the message id in the payload. A scan of the table: the
-- dashboard's lookup of one job, not a worker's path (the row holds no id column).
SELECT queue, payload, attempts, reserved_at, heartbeat_at, available_at FROM {jobs}
WHERE payload LIKE ? ORDER BY id LIMIT 20

-- name: purge
DELETE FROM {jobs} WHERE queue = ?

-- name: failed_insert
INSERT INTO {failed} (uuid, connection, queue, payload, exception, failed_at)
VALUES (?, ?, ?, ?, ?, ?)

-- name: failed_list
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed} ORDER BY id

-- name: failed_list_queue
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed}
WHERE queue = ? ORDER BY id

-- name: failed_find
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed} WHERE uuid = ?

-- name: failed_forget
DELETE FROM {failed} WHERE uuid = ?

-- name: failed_flush
DELETE FROM {failed}

-- name: failed_flush_older
DELETE FROM {failed} WHERE failed_at < ?

-- The same, limited to one queue connection's rows: a failed_store table that several
-- connections (sqs, cloudflare) share.

-- name: failed_list_of
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed}
WHERE connection = ? ORDER BY id

-- name: failed_list_queue_of
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed}
WHERE connection = ? AND queue = ? ORDER BY id

-- name: failed_find_of
SELECT uuid, connection, queue, payload, exception, failed_at FROM {failed}
WHERE connection = ? AND uuid = ?

-- name: failed_forget_of
DELETE FROM {failed} WHERE connection = ? AND uuid = ?

-- name: failed_flush_of
DELETE FROM {failed} WHERE connection = ?

-- name: failed_flush_older_of
DELETE FROM {failed} WHERE connection = ? AND failed_at < ?

-- Retry claims: the claim rides in the stored body (its meta.retry_claim), so a claim
-- is a compare-and-set of the body, and the retried record is deleted only while it
-- still holds that body (a job that failed again after the claim keeps its record).

-- name: failed_claim
UPDATE {failed} SET payload = ? WHERE uuid = ? AND payload = ?

-- name: failed_claim_of
UPDATE {failed} SET payload = ? WHERE uuid = ? AND payload = ? AND connection = ?

-- name: failed_forget_body
DELETE FROM {failed} WHERE uuid = ? AND payload = ?

-- name: failed_forget_body_of
DELETE FROM {failed} WHERE uuid = ? AND payload = ? AND connection = ?

-- name: adopt
-- A claim took back lapsed rows that a consumer of the same driver is still running
-- (its event loop was starved past the lease): the runs keep them under the claim's
-- reserved_at, and the attempt the claim counted goes back (no run started).
-- params: reserved_at, id…
UPDATE {jobs} SET attempts = attempts - 1 WHERE reserved_at = ? AND id IN ({{ids}})
