-- ?1 JSON array of role names (empty: every row). Every row asked for, each
-- with the current generation, where the next read of changes starts. One
-- row with no role when there is none.
SELECT c.generation AS next, l.*
FROM {table}_changes AS c
LEFT JOIN (
    SELECT {lease_row}
    FROM {table}, (SELECT {now_ms} AS ms) AS now
    WHERE json_array_length(?1) = 0 OR role IN (SELECT value FROM json_each(?1))
) AS l ON 1
WHERE c.id = 1
