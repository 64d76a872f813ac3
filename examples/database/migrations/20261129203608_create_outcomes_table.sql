-- The example app's own table: what each job did.
CREATE TABLE IF NOT EXISTS outcomes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    what TEXT NOT NULL
);
