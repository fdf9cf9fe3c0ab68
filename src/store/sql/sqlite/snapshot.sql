-- ?1 JSON array of role names.
SELECT {lease_row}
FROM {table}, (SELECT {now_ms} AS ms) AS now
WHERE role IN (SELECT value FROM json_each(?1))
