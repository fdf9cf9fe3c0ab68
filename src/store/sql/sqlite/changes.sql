-- ?1 the generation last read, ?2 the horizon in ms. Returns the rows a
-- term began or ended on after ?1, and the rows whose holder has less than
-- the horizon left (or is named with its term over), each with the current
-- generation, where the next read starts. One row with no role when
-- nothing changed.
SELECT c.generation AS next, l.*
FROM {table}_changes AS c
LEFT JOIN (
    SELECT {lease_row}
    FROM {table}, (SELECT {now_ms} AS ms) AS now
    WHERE changed > ?1 OR (holder_id IS NOT NULL AND expires_at_ms < now.ms + ?2)
) AS l ON 1
WHERE c.id = 1
