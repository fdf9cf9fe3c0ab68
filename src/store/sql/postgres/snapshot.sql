-- $1 role names.
SELECT {lease_row}
FROM {table} WHERE role = ANY($1::text[])
