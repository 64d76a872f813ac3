-- haze queue tables for connection 'database' (sqlite, database 'main').
-- Written by `haze make:queue-tables`; applied by `haze db:migrate`.
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    reserved_at REAL,
    heartbeat_at REAL,
    available_at REAL NOT NULL,
    created_at REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS jobs_queue_idx ON jobs (queue, reserved_at, available_at);

CREATE TABLE IF NOT EXISTS failed_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid TEXT NOT NULL UNIQUE,
    connection TEXT NOT NULL,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    exception TEXT NOT NULL,
    failed_at REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS failed_jobs_failed_at_idx ON failed_jobs (failed_at);
