SELECT {lease_row}
FROM {table}, (SELECT {now_ms} AS ms) AS now
ORDER BY role
