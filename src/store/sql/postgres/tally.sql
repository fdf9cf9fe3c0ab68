-- $1 role names. How many rows there are, how many name a holder, and the
-- sum of their tokens (a term count each: far from overflowing).
SELECT count(*) AS records, count(holder_id) AS holders,
       coalesce(sum(token), 0)::bigint AS tokens
FROM {table} WHERE role = ANY($1::text[])
