-- Creates or updates the schema. Every term change bumps the one generation
-- counter in {table}_changes, which subscribers poll (and the store's
-- migrate then adds the `changed` column to tables made before it, and the
-- triggers of mark.sql that set it).
CREATE TABLE IF NOT EXISTS {table} (
    role            TEXT PRIMARY KEY CHECK (length(CAST(role AS BLOB)) BETWEEN 1 AND 128),
    holder_id       TEXT,
    holder_address  TEXT,
    token           INTEGER NOT NULL DEFAULT 0,
    duration_ms     INTEGER NOT NULL DEFAULT 0,
    acquired_at_ms  INTEGER,
    renewed_at_ms   INTEGER,
    expires_at_ms   INTEGER NOT NULL DEFAULT 0,
    changed         INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {table}_changes (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    generation  INTEGER NOT NULL
);
INSERT OR IGNORE INTO {table}_changes (id, generation) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS {table}_term_change AFTER UPDATE ON {table} FOR EACH ROW
WHEN NEW.token IS NOT OLD.token OR NEW.holder_id IS NOT OLD.holder_id
BEGIN
    UPDATE {table}_changes SET generation = generation + 1 WHERE id = 1;
END;
-- Presence records for partition balancing: one row per live instance.
CREATE TABLE IF NOT EXISTS {table}_members (
    instance_id    TEXT PRIMARY KEY,
    address        TEXT NOT NULL,
    candidate      INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL,
    routes         TEXT NOT NULL DEFAULT '',
    changed        INTEGER NOT NULL DEFAULT 0
);
-- Partition definitions: what decides which role owns a key. The epoch goes
-- up with every change; no instance serves the partition before
-- settled_at_ms. (Tables from before the routes column get it from the
-- store's migrate, which SQLite cannot say conditionally here.)
CREATE TABLE IF NOT EXISTS {table}_partitions (
    name           TEXT PRIMARY KEY,
    definition     TEXT NOT NULL,
    epoch          INTEGER NOT NULL,
    settled_at_ms  INTEGER NOT NULL
);
