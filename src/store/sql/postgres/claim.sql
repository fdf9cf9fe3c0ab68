-- $1 roles, $2 held tokens (NULL: none), $3 durations in ms, $4 instance id,
-- $5 instance address, $6 one-shot flags. Takes every role that is free,
-- released, expired or already held by $4 (unless the claim is one-shot),
-- keeps the token only when $4 holds the unexpired term $2, and starts a new
-- term (token + 1) otherwise. Returns the granted roles.
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $6::bool[])
        AS r(role, held_token, duration_ms, one_shot)
), now AS MATERIALIZED (
    SELECT clock_timestamp() AS ts
), takeable AS MATERIALIZED (
    -- Lock only rows this instance may take, and never wait on another claimer.
    -- A locked row cannot change before the UPDATE below, so the conditions
    -- read here hold there.
    SELECT l.role,
           (l.holder_id = $4 AND l.token = r.held_token AND l.expires_at > now.ts) AS renew
    FROM {table} l JOIN req r ON r.role = l.role CROSS JOIN now
    WHERE l.holder_id IS NULL OR (l.holder_id = $4 AND NOT r.one_shot) OR l.expires_at <= now.ts
    ORDER BY l.role
    FOR UPDATE OF l SKIP LOCKED
)
UPDATE {table} l SET
    token = CASE WHEN k.renew THEN l.token ELSE l.token + 1 END,
    acquired_at = CASE WHEN k.renew THEN l.acquired_at ELSE now.ts END,
    renewed_at = now.ts,
    expires_at = now.ts + r.duration_ms * interval '1 millisecond',
    duration_ms = r.duration_ms,
    holder_id = $4,
    holder_address = $5
FROM takeable k, req r, now
WHERE l.role = k.role AND r.role = k.role
RETURNING l.role, l.token
