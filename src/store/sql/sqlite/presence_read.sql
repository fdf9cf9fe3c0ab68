-- Every unexpired presence record; the long expired ones are removed first.
SELECT instance_id, address, candidate, routes FROM {table}_members
WHERE expires_at_ms > {now_ms}
