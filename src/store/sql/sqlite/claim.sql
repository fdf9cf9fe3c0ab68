-- ?1 instance id, ?2 instance address, ?3 JSON array of objects with "role",
-- "held" (token or null), "ms" and "once" (one-shot: 1 or 0). Takes every
-- role that is free, released, expired or already held by ?1 (unless the
-- claim is one-shot), keeps the token only when ?1 holds the unexpired term
-- "held", and starts a new term (token + 1) otherwise. One statement: SQLite takes the database write lock for it, so
-- the check and the update cannot interleave with another process.
WITH req AS (
    SELECT json_extract(value, '$.role') AS role,
           json_extract(value, '$.held') AS held,
           json_extract(value, '$.ms') AS ms,
           json_extract(value, '$.once') AS once,
           {now_ms} AS now
    FROM json_each(?3)
), takeable AS (
    SELECT l.role, r.ms, r.now,
           (l.holder_id = ?1 AND l.token = r.held AND l.expires_at_ms > r.now) AS renew
    FROM {table} l JOIN req r ON r.role = l.role
    WHERE l.holder_id IS NULL OR (l.holder_id = ?1 AND r.once = 0) OR l.expires_at_ms <= r.now
)
UPDATE {table} SET
    token = CASE WHEN k.renew THEN {table}.token ELSE {table}.token + 1 END,
    acquired_at_ms = CASE WHEN k.renew THEN {table}.acquired_at_ms ELSE k.now END,
    renewed_at_ms = k.now,
    expires_at_ms = k.now + k.ms,
    duration_ms = k.ms,
    holder_id = ?1,
    holder_address = ?2
FROM takeable AS k
WHERE {table}.role = k.role
RETURNING role, token
