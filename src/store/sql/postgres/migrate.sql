-- Creates or updates the schema. Sent as one simple-query message, which
-- PostgreSQL runs as one implicit transaction: the advisory lock serializes
-- concurrent migrations. The notify channel is named after the table.
SELECT pg_advisory_xact_lock(hashtext('rolegate-migrate:{table}'));
CREATE TABLE IF NOT EXISTS {table} (
    role            text PRIMARY KEY CHECK (octet_length(role) BETWEEN 1 AND 128),
    holder_id       text,
    holder_address  text,
    token           bigint NOT NULL DEFAULT 0,
    duration_ms     bigint NOT NULL DEFAULT 0,
    acquired_at     timestamptz,
    renewed_at      timestamptz,
    expires_at      timestamptz NOT NULL DEFAULT 'epoch'
);
CREATE OR REPLACE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{table}', NEW.role);
    RETURN NULL;
END
$fn$;
-- The transaction that last began or ended a term on the row (a 64-bit
-- transaction id), set by the trigger below: readers of changes ask for the
-- rows changed by transactions not yet finished when they last read.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS changed bigint NOT NULL DEFAULT 0;
CREATE OR REPLACE FUNCTION {table}_mark() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.changed := txid_current();
    RETURN NEW;
END
$fn$;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = '{table}_term_change' AND tgrelid = '{table}'::regclass) THEN
        CREATE TRIGGER {table}_term_change AFTER UPDATE ON {table} FOR EACH ROW
        WHEN (NEW.token IS DISTINCT FROM OLD.token OR NEW.holder_id IS DISTINCT FROM OLD.holder_id)
        EXECUTE FUNCTION {table}_notify();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = '{table}_term_mark' AND tgrelid = '{table}'::regclass) THEN
        CREATE TRIGGER {table}_term_mark BEFORE UPDATE ON {table} FOR EACH ROW
        WHEN (NEW.token IS DISTINCT FROM OLD.token OR NEW.holder_id IS DISTINCT FROM OLD.holder_id)
        EXECUTE FUNCTION {table}_mark();
        CREATE TRIGGER {table}_insert_mark BEFORE INSERT ON {table} FOR EACH ROW
        EXECUTE FUNCTION {table}_mark();
    END IF;
END
$do$;
-- Presence records for partition balancing: one row per live instance.
CREATE TABLE IF NOT EXISTS {table}_members (
    instance_id  text PRIMARY KEY,
    address      text NOT NULL,
    candidate    boolean NOT NULL,
    expires_at   timestamptz NOT NULL
);
-- The route-table fingerprint each member publishes (empty: none).
ALTER TABLE {table}_members ADD COLUMN IF NOT EXISTS routes text NOT NULL DEFAULT '';
-- The transaction that last added, changed, revived or ended the record
-- (a renewal that changes nothing else is no change), for readers of
-- presence changes.
ALTER TABLE {table}_members ADD COLUMN IF NOT EXISTS changed bigint NOT NULL DEFAULT 0;
CREATE OR REPLACE FUNCTION {table}_member_mark() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.changed := txid_current();
    ELSIF NEW.address IS DISTINCT FROM OLD.address
          OR NEW.candidate IS DISTINCT FROM OLD.candidate
          OR NEW.routes IS DISTINCT FROM OLD.routes
          OR OLD.expires_at <= clock_timestamp()
          OR NEW.expires_at <= clock_timestamp() THEN
        NEW.changed := txid_current();
    END IF;
    RETURN NEW;
END
$fn$;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = '{table}_member_mark'
                     AND tgrelid = '{table}_members'::regclass) THEN
        CREATE TRIGGER {table}_member_mark BEFORE INSERT OR UPDATE ON {table}_members
        FOR EACH ROW EXECUTE FUNCTION {table}_member_mark();
    END IF;
END
$do$;
-- Partition definitions: what decides which role owns a key. The epoch goes
-- up with every change; no instance serves the partition before settled_at.
CREATE TABLE IF NOT EXISTS {table}_partitions (
    name        text PRIMARY KEY,
    definition  text NOT NULL,
    epoch       bigint NOT NULL,
    settled_at  timestamptz NOT NULL
);
