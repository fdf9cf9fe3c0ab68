-- $1 role names. Every row asked for (the filter: by name, or
-- none when no role was named), each with the cursor to read changes from
-- next (see changes.sql). One row with no role when there is none.
SELECT s.next, l.*
FROM (SELECT txid_snapshot_xmin(txid_current_snapshot()) AS next) AS s
LEFT JOIN LATERAL (
    SELECT {lease_row}
    FROM {table}
    WHERE {roles}
) AS l ON true
