-- ?1 JSON array of role names. How many rows there are, how many name a
-- holder, and the sum of their tokens (a term count each: far from
-- overflowing; SQLite fails the sum rather than wrap).
SELECT count(*) AS records, count(holder_id) AS holders,
       coalesce(sum(token), 0) AS tokens
FROM {table} WHERE role IN (SELECT value FROM json_each(?1))
