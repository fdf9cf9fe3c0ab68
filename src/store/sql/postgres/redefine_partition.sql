-- $1 name, $2 definition, $3 the epoch expected (0: no record), $4 settle
-- in ms. Replaces the definition only if its epoch is still $3, bumps the
-- epoch, starts the settle window by the database clock, and wakes every
-- subscriber. No row: the epoch had moved on.
WITH changed AS (
    INSERT INTO {table}_partitions AS p (name, definition, epoch, settled_at)
    SELECT $1, $2, 1, clock_timestamp() + $4 * interval '1 millisecond' WHERE $3 = 0
    ON CONFLICT (name) DO NOTHING
    RETURNING name
), updated AS (
    UPDATE {table}_partitions SET
        definition = $2,
        epoch = epoch + 1,
        settled_at = clock_timestamp() + $4 * interval '1 millisecond'
    WHERE name = $1 AND epoch = $3 AND $3 > 0
    RETURNING name
), woken AS (
    SELECT pg_notify('{table}', 'partition:' || name) FROM (
        SELECT name FROM changed UNION ALL SELECT name FROM updated
    ) n
)
SELECT (SELECT count(*) FROM woken) AS changed
