-- ?1 instance id, ?2 JSON array of objects with "role" and "token". Clears
-- the holder of each term ?1 still holds (the row and its token stay).
UPDATE {table} SET holder_id = NULL, holder_address = NULL, expires_at_ms = {now_ms}
FROM (SELECT json_extract(value, '$.role') AS role,
             json_extract(value, '$.token') AS token
      FROM json_each(?2)) AS r
WHERE {table}.role = r.role AND {table}.token = r.token AND {table}.holder_id = ?1
RETURNING role
