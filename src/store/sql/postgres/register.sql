-- $1 role names. Adds a blank row (no holder, token 0) for each missing role.
INSERT INTO {table} (role)
SELECT x FROM unnest($1::text[]) AS x ORDER BY x
ON CONFLICT (role) DO NOTHING
