-- rolegate on PostgreSQL, step 3 of 3: the runtime role's table privileges.
-- Run after `rolegate migrate` (step 2) created the table, as rolegate_owner
-- or a superuser, connected to the app's database:
--
--   psql "postgres://postgres@db.internal:5432/app" -f deploy/postgres/grants.sql
--
-- SELECT: snapshots and `rolegate status`. INSERT: each gateway registers its
-- roles' rows at start (INSERT ... ON CONFLICT DO NOTHING). UPDATE: claim,
-- renew and release (also needed by SELECT ... FOR UPDATE). No DELETE: rows
-- are never deleted. No EXECUTE on the trigger function and no privilege for
-- LISTEN/NOTIFY are needed. If store.table is not the default, use that name.
-- A read-only monitoring role needs SELECT only.

GRANT SELECT, INSERT, UPDATE ON rolegate_role_leases TO rolegate_app;
-- Presence records (partition balancing): upserted every heartbeat, deleted
-- on a graceful stop, pruned an hour after they expired.
GRANT SELECT, INSERT, UPDATE, DELETE ON rolegate_role_leases_members TO rolegate_app;
-- Partition definitions: read every heartbeat, inserted by the first
-- gateway to see a partition; UPDATE by a gateway that records a partition
-- whose roles are already held (its statement updates, so PostgreSQL asks
-- for UPDATE even when no row changes), and by `rolegate partitions resize`.
GRANT SELECT, INSERT, UPDATE ON rolegate_role_leases_partitions TO rolegate_app;
