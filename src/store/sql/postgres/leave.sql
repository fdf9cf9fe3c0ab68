-- $1 instance id. Removes its presence record and wakes the others, so they
-- rebalance at once.
WITH gone AS (
    DELETE FROM {table}_members WHERE instance_id = $1 RETURNING instance_id
)
SELECT pg_notify('{table}', 'member') FROM gone
