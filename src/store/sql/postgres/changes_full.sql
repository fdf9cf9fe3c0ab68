-- $1 role names (none: every row). Every row asked for, each with the
-- cursor to read changes from next (see changes.sql). One row with no role
-- when there is none.
SELECT s.next, l.*
FROM (SELECT txid_snapshot_xmin(txid_current_snapshot()) AS next) AS s
LEFT JOIN LATERAL (
    SELECT {lease_row}
    FROM {table}
    WHERE cardinality($1::text[]) = 0 OR role = ANY($1::text[])
) AS l ON true
