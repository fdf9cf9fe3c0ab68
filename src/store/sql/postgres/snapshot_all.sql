SELECT {lease_row}
FROM {table} ORDER BY role
