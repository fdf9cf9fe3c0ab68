-- $1 instance id, $2 address, $3 candidate, $4 ttl in ms, $5 route-table
-- fingerprint. Writes this instance's presence record, expiring by the
-- database clock, removes records expired over an hour ago, and returns
-- every unexpired record.
WITH me AS (
    INSERT INTO {table}_members AS m (instance_id, address, candidate, expires_at, routes)
    VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond', $5)
    ON CONFLICT (instance_id) DO UPDATE
        SET address = EXCLUDED.address, candidate = EXCLUDED.candidate,
            expires_at = EXCLUDED.expires_at, routes = EXCLUDED.routes
    RETURNING instance_id, address, candidate, routes
), gone AS (
    DELETE FROM {table}_members
    WHERE expires_at < clock_timestamp() - interval '1 hour' AND instance_id <> $1
)
SELECT instance_id, address, candidate, routes FROM {table}_members
WHERE expires_at > clock_timestamp() AND instance_id <> $1
UNION ALL
SELECT instance_id, address, candidate, routes FROM me
