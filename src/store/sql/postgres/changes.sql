-- $1 the cursor: the oldest transaction id whose changes the reader may not
-- have seen; $2 the horizon in ms. Returns the rows whose term a
-- transaction from $1 on began or ended, and the rows whose holder has less
-- than the horizon left (or is named with its term over), each with the
-- next cursor: the oldest transaction unfinished when this statement's
-- snapshot was taken, whose changes (and all later ones) the next read
-- returns. One row with no role when nothing changed.
SELECT s.next, l.*
FROM (SELECT txid_snapshot_xmin(txid_current_snapshot()) AS next,
             clock_timestamp() AS now) AS s
LEFT JOIN LATERAL (
    SELECT {lease_row}
    FROM {table}
    WHERE changed >= $1
       OR (holder_id IS NOT NULL AND expires_at < s.now + $2 * interval '1 millisecond')
) AS l ON true
