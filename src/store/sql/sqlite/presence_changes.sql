-- ?1 the generation last read (NULL: a full read), ?2 the horizon in ms.
-- Every live presence record (full), or the records added, changed,
-- revived or ended after ?1 and those that ended within three horizons
-- before now (a reader reads every tick, well within that); `live` says
-- which are gone. Each row carries the current generation, where the next
-- read starts; one row with no record when nothing changed.
SELECT c.generation AS next, o.*
FROM {table}_changes AS c
LEFT JOIN (
    SELECT instance_id, address, candidate, routes, expires_at_ms > now.ms AS live
    FROM {table}_members, (SELECT {now_ms} AS ms) AS now
    WHERE CASE WHEN ?1 IS NULL THEN expires_at_ms > now.ms
               ELSE changed > ?1 OR (expires_at_ms <= now.ms AND expires_at_ms > now.ms - 3 * ?2) END
) AS o ON 1
WHERE c.id = 1
