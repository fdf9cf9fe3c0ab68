-- $1 roles, $2 tokens, $3 instance id. Clears the holder of each term $3
-- still holds (the row and its token stay). Returns the released roles.
UPDATE {table} l SET holder_id = NULL, holder_address = NULL, expires_at = clock_timestamp()
FROM unnest($1::text[], $2::bigint[]) AS r(role, token)
WHERE l.role = r.role AND l.token = r.token AND l.holder_id = $3
RETURNING l.role
