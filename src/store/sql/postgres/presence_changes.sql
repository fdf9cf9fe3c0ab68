-- $1 instance id, $2 address, $3 candidate, $4 ttl in ms, $5 route-table
-- fingerprint, $6 the cursor (NULL: a full read), $7 the horizon in ms.
-- Writes this instance's presence record (expiring by the database clock;
-- records expired over an hour ago are removed on the way), then reads
-- either every live record (full) or the records added, changed, revived
-- or ended by a transaction from $6 on, and those that ended within three
-- horizons before now (a reader reads every tick, well within that);
-- `live` says which are gone. Each row carries the next cursor (see
-- changes.sql); this instance's own record comes last, on a full read or
-- when this write changed it.
WITH me AS (
    INSERT INTO {table}_members AS m (instance_id, address, candidate, expires_at, routes)
    VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond', $5)
    ON CONFLICT (instance_id) DO UPDATE
        SET address = EXCLUDED.address, candidate = EXCLUDED.candidate,
            expires_at = EXCLUDED.expires_at, routes = EXCLUDED.routes
    RETURNING instance_id, address, candidate, routes, changed
), gone AS (
    DELETE FROM {table}_members
    WHERE expires_at < clock_timestamp() - interval '1 hour' AND instance_id <> $1
), s AS MATERIALIZED (
    SELECT txid_snapshot_xmin(txid_current_snapshot()) AS next, clock_timestamp() AS now
)
SELECT s.next, o.instance_id, o.address, o.candidate, o.routes, o.live
FROM s LEFT JOIN LATERAL (
    SELECT instance_id, address, candidate, routes, expires_at > s.now AS live
    FROM {table}_members
    WHERE instance_id <> $1
      AND CASE WHEN $6::bigint IS NULL THEN expires_at > s.now
               ELSE changed >= $6::bigint
                    OR (expires_at <= s.now
                        AND expires_at > s.now - 3 * $7 * interval '1 millisecond') END
) AS o ON true
UNION ALL
SELECT s.next, me.instance_id, me.address, me.candidate, me.routes, true FROM s, me
WHERE $6::bigint IS NULL OR me.changed = txid_current()
