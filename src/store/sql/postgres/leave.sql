-- $1 instance id. Ends its presence record now (kept, so readers of
-- presence changes see it go) and wakes the others, so they rebalance at
-- once.
WITH gone AS (
    UPDATE {table}_members SET expires_at = clock_timestamp()
    WHERE instance_id = $1 AND expires_at > clock_timestamp()
    RETURNING instance_id
)
SELECT pg_notify('{table}', 'member') FROM gone
