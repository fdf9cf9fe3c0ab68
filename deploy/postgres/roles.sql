-- rolegate on PostgreSQL, step 1 of 3: the two database roles.
-- Run as a superuser (or a role with CREATEROLE that owns the database),
-- connected to the app's database:
--
--   psql "postgres://postgres@db.internal:5432/app" \
--     -v owner_password="$(openssl rand -hex 24)" \
--     -v app_password="$ROLEGATE_DB_PASSWORD" \
--     -f deploy/postgres/roles.sql
--
-- Step 2: `rolegate migrate` once, as rolegate_owner (it creates the table
-- rolegate_role_leases with its primary-key index, the function
-- rolegate_role_leases_notify() and the trigger rolegate_role_leases_term_change).
-- Step 3: deploy/postgres/grants.sql.
--
-- Passwords go into store.url, so use URL-safe characters (hex is).
-- CONNECT and USAGE are PUBLIC's by default; they are granted explicitly so
-- this also works where an admin revoked them from PUBLIC.

-- Owns the schema objects; used only by `rolegate migrate`.
CREATE ROLE rolegate_owner LOGIN PASSWORD :'owner_password';
GRANT CONNECT ON DATABASE :"DBNAME" TO rolegate_owner;
GRANT USAGE, CREATE ON SCHEMA public TO rolegate_owner;

-- What the gateways connect as: reads and writes lease rows, nothing else.
CREATE ROLE rolegate_app LOGIN PASSWORD :'app_password';
GRANT CONNECT ON DATABASE :"DBNAME" TO rolegate_app;
GRANT USAGE ON SCHEMA public TO rolegate_app;
